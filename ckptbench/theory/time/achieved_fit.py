"""The achieved fractions fitted on results/h200-20261204-gpu-small/run
by scripts/achieved_fit.py (do not edit: re-run it)."""

from .achieved import Achieved

H200 = Achieved(
    card='NVIDIA H200',
    f_compute=0.8910976371690241,
    f_memory=0.5224558654660133,
    s_kernel=6.314640970722192e-06,
    f_copy=0.7534850540209155,
    s_host=4.275169988506192e-05,
    low=0.8729780544450711,
    high=1.0959031338780878,
    points=42,
    source='results/h200-20261204-gpu-small/run',
    held_out='each (batch, sequence) shape predicted by the fit on the other shapes',
)
