"""Predictions and verdicts: the analytic estimate, FLOP and communication formulas, the FakeTensor
simulation, and the checks that set each prediction beside an observation."""
