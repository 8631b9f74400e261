"""ckptbench: measure activation checkpointing, offload and local SGD on real Hugging Face models."""

__version__ = "0.1.0"
