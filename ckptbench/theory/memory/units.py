"""Element sizes the formulas share (bytes): fp32 for norms, losses and optimizer steps, int64 for ids,
16 bits for autocast's compute copies."""

FP32 = 4
INT64 = 8
HALF = 2  # bf16 / fp16: what autocast computes in over fp32 weights
