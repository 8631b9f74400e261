"""Results on disk: atomic files, the locked JSONL record store, and comparisons between two runs."""
