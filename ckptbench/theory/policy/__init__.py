"""Which setting to run: the plan (which checkpointing fits a memory and is fastest), the strategies it
ranks together, and the exact per-layer policy search under a budget."""
