"""The HTML report: one self-contained file per run, rendered from the records alone."""
