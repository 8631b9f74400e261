"""How a point is trained, beside what it trains: the one typed place for each kind of run.

A :class:`Setup` holds every choice of *how* a model is trained that changes what a step keeps in memory
or how long it takes: the precision's autocast, the loop that drives the step, LoRA adapters, how state is
sharded across ranks, and the optimizer.  ``train/`` builds the run from it, ``theory/`` predicts it,
``plan`` searches it, and the suite file names it (``[model] precision``, ``[train] loop / lora / sharding
/ optimizer`` and the sweep axes of the same names).  Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# precision name -> (parameter dtype, autocast dtype): pure precisions keep every tensor in one dtype; the
# mixed ones are what Trainer(bf16=True / fp16=True) and Accelerator(mixed_precision=...) run: fp32 master
# weights, gradients and optimizer state, compute under torch.autocast (fp16 with a gradient scaler)
PRECISIONS = {"fp32": ("fp32", ""), "bf16": ("bf16", ""), "fp16": ("fp16", ""),
              "bf16-mixed": ("fp32", "bf16"), "fp16-mixed": ("fp32", "fp16")}
LOOPS = ("manual", "trainer", "accelerate")
# ddp: every rank holds the whole model, gradients are all-reduced (or, with local SGD, parameters
# averaged); fsdp: FSDP2 ``fully_shard`` per decoder layer and on the root, each rank holding 1/N of the
# parameters, gradients and optimizer state
SHARDINGS = ("ddp", "fsdp")
# adamw: torch.optim.AdamW with torch's own default (the foreach implementation on CUDA, the per-parameter
# loop on CPU); adamw-foreach / adamw-loop: foreach=True / False stated; sgd: torch.optim.SGD with momentum
# 0.9; adafactor: transformers.optimization.Adafactor (factored second moments, no first moment);
# adamw-8bit: bitsandbytes' AdamW8bit (8-bit blockwise moments), where bitsandbytes runs; adamw-fused:
# AdamW(fused=True), what Trainer's default optim (adamw_torch_fused) builds
OPTIMIZERS = ("adamw", "adamw-foreach", "adamw-loop", "sgd", "adafactor", "adamw-8bit", "adamw-fused")
LORA_QUANTIZE = ("", "nf4")  # "": the frozen base in the model's dtype; "nf4": QLoRA's 4-bit base


def precision_name(dtype: str, autocast: str) -> str:
    """The precision a (parameter dtype, autocast dtype) pair is: fp32, bf16, fp16, bf16-mixed, fp16-mixed."""
    return f"{autocast}-mixed" if autocast else dtype


@dataclass(frozen=True)
class Lora:
    """LoRA adapters through ``peft``: the base model frozen, rank-``r`` adapters on ``targets``.

    ``targets`` empty means the modules peft itself picks for the model type; ``quantize = "nf4"`` is
    QLoRA (the frozen base in bitsandbytes' 4-bit NF4, where bitsandbytes runs on the device).
    """

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    targets: tuple[str, ...] = ()
    quantize: str = ""

    @property
    def label(self) -> str:
        return ("q" if self.quantize else "") + f"lora{self.r}"

    @classmethod
    def from_dict(cls, data: dict) -> Lora:
        return cls(**{**data, "targets": tuple(data.get("targets", ()))})


@dataclass(frozen=True)
class Setup:
    """How a point is trained (see the module's text).

    - ``autocast``: "" for a pure precision (every tensor in the model's dtype), or the compute dtype
      ("bf16", "fp16") of autocast mixed precision over the model's fp32 master weights;
    - ``loop``: ``manual`` (the plain step loop), ``trainer`` (``transformers.Trainer.train()``) or
      ``accelerate`` (``Accelerator.prepare`` / ``accumulate`` / ``backward``);
    - ``lora``: LoRA adapters (:class:`Lora`), or None for full fine-tuning;
    - ``sharding``: ``ddp`` or ``fsdp`` (:data:`SHARDINGS`), meaningful for more than one rank;
    - ``optimizer``: one of :data:`OPTIMIZERS`.
    """

    autocast: str = ""
    loop: str = "manual"
    lora: Lora | None = None
    sharding: str = "ddp"
    optimizer: str = "adamw"

    @property
    def label(self) -> str:
        """What the setup adds to a point's name: empty at the defaults (a pure dtype, the manual loop, full
        fine-tuning, AdamW).  The sharding is named with the world size, in the Case's strategy."""
        parts = [f"{self.autocast}-mixed"] if self.autocast else []
        parts += [self.loop] if self.loop != "manual" else []
        parts += [self.lora.label] if self.lora else []
        parts += [self.optimizer] if self.optimizer != "adamw" else []
        return "+".join(parts)

    def id_fields(self) -> dict:
        """The fields a Case's id hashes: those that were there before a choice existed are left out at
        their defaults, so every point keeps the id it had."""
        out = asdict(self)
        for key, default in (("lora", None), ("sharding", "ddp"), ("optimizer", "adamw")):
            if out[key] == default:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Setup:
        values = dict(data)
        if values.get("lora"):
            values["lora"] = Lora.from_dict(values["lora"])
        return cls(**values)
