"""Element sizes the formulas share (bytes): fp32 for norms, losses and optimizer steps, int64 for ids."""

FP32 = 4
INT64 = 8
