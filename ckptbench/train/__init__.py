"""Training as users run it: models built from transformers configs, checkpointing switched on with
transformers' own API, the plain step and the accelerate local-SGD loop."""
