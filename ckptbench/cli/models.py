"""``ckptbench models``: the presets, their model types and sizes, and how each is estimated.

Parameter counts are those of the model transformers builds on the meta device (no memory, no weights), so
they are the real architecture's, MoE experts and tied heads included: counted once by
``scripts/preset_sizes.py`` into :mod:`ckptbench.point.preset_sizes` (a test rebuilds every preset against it),
so listing them needs neither torch nor transformers.
"""

from __future__ import annotations


def cmd_models(args) -> int:
    from ..point.case import PRESETS, preset
    from ..point.preset_sizes import PARAMS

    print(f"{'preset':<14} {'model_type':<12} {'layers':>6} {'hidden':>6} {'params':>9}  estimate")
    for name in PRESETS:
        spec, n = preset(name), PARAMS[name]
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"
        print(f"{name:<14} {spec.family:<12} {spec.layers:>6} {spec.hidden:>6} {size:>9}  "
              f"{'analytic' if spec.analytic else 'simulation'}")
    print("any other causal LM: [model] config = \"path/config.json\" | hub = \"org/name\" | model_type = \"...\" "
          "(+ dimension overrides); or: ckptbench sweep --model ... --layers 2 ...")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list the model presets with their sizes")
    p.set_defaults(func=cmd_models)
