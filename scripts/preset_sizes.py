"""Write ckptbench/point/preset_sizes.py: each preset's parameter count, as transformers builds the model on the
meta device.  `ckptbench models` lists them without importing torch; tests/unit/test_models.py rebuilds
every preset and fails when the table is stale (run this script again after changing a preset)."""

from __future__ import annotations

import pathlib

import torch

from ckptbench.point.case import PRESETS, preset
from ckptbench.train.models import build_model


def main() -> None:
    counts = {}
    for name in PRESETS:
        with torch.device("meta"):
            model = build_model(preset(name), "meta")
        counts[name] = sum(p.numel() for p in model.parameters())
    lines = ['"""Parameter count of each preset as transformers builds it (written by scripts/preset_sizes.py;',
             'tests/unit/test_models.py holds it to the built models)."""', "", "PARAMS = {"]
    lines += [f"    {name!r}: {n},"for name, n in counts.items()]
    lines += ["}", ""]
    path = pathlib.Path(__file__).resolve().parents[1] / "ckptbench" / "point" / "preset_sizes.py"
    path.write_text("\n".join(lines))
    print(f"wrote {path} ({len(counts)} presets)")


if __name__ == "__main__":
    main()
