"""ckptbench's CPU reference points per commit: the smoke suite (a tiny Llama, every checkpointing setting,
with and without offload), memory to the byte, step time with its interval over 3 workers (``ckptbench
history``)."""

from ckptbench.history.benchmark import suite_benchmark

Training = suite_benchmark("suites/smoke.toml", repeats=3)  # each point in 3 workers: the time test is across them
