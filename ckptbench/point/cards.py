"""The cards ``plan`` knows by name: what torch reports for each, and the memory it can have."""

from __future__ import annotations

# --device name -> (the name torch reports, the memory torch sees: get_device_properties().total_memory).  A
# card's marketed "80 GB" is not what an allocator can have: these are the totals torch printed on real cards
# in public logs (in MiB, as torch prints them; the A100 80 GB from its out-of-memory message, 79.15 GiB);
# they vary by a few MiB with the driver.  An "80 GB" H100 is 79.19 GiB, an H200 139.80 GiB, not 141e9 bytes.
MIB = 2**20
CARDS = {
    "a100-40": ("NVIDIA A100-SXM4-40GB", 40536 * MIB),
    "a100": ("NVIDIA A100-SXM4-80GB", 81050 * MIB),
    "h100": ("NVIDIA H100 80GB HBM3", 81089 * MIB),
    "h200": ("NVIDIA H200", 143156 * MIB),
    "l40s": ("NVIDIA L40S", 45589 * MIB),
    "rtx4090": ("NVIDIA GeForce RTX 4090", 24563 * MIB),
}
