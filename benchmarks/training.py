"""ckptbench's CPU reference points per commit: the smoke suite (a tiny Llama, every checkpointing setting,
with and without offload), memory to the byte, step time with its interval (``ckptbench history``)."""

from ckptbench.history.benchmark import suite_benchmark

Training = suite_benchmark("suites/smoke.toml")
