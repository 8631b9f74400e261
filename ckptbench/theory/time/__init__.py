"""How long a step (and a sweep) takes: FLOPs and MFU, the step-time model from measured steps, the traced
roofline and achieved fractions for a card not here, a plan's step on its ranks, a sweep's duration."""
