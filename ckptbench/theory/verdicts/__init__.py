"""Where predictions meet observations: every check and its verdict, the two memory meters' agreement, a
DDP rank's buckets, and the annotation each record gets once its point has run."""
