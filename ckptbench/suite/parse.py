"""Suite files: TOML in, validated :class:`Suite` of :class:`Case` out.

Every way a suite can be wrong becomes a :class:`SuiteError` naming the file, the key and the reason,
which the CLI prints as one line before exiting with status 2.  Validation happens here, before any
worker starts, so a typo costs a second, not a sweep.

Axes in ``[sweep]`` are crossed.  Two kinds of pairs in that product mean nothing and are left out
rather than rejected (a user asking for ``every_n_layers = [0, 1]`` × ``offload = [false, true]`` wants
offload where there is something to offload): offload or a SAC policy without checkpointing, local SGD on
one process, and a choice of averaging implementation where nothing is averaged.  A suite in which such a setting can never apply is rejected.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import asdict, replace

import tomllib

from ..base.env import torchrun_path
from ..base.regularfile import open_regular
from ..point.case import (
    ATTENTIONS,
    BYTE_VOCAB,
    DATA_SOURCES,
    DEVICES,
    DROPOUTS,
    DTYPES,
    FAMILIES,
    PRESETS,
    SYNC_IMPLS,
    Case,
    DataSpec,
    ModelSpec,
    Suite,
    canonical_config,
    preset,
)
from ..point.setup import PRECISIONS
from ..sources.configs import (
    DIM_WORDS,
    ConfigError,
    at_depth,
    build_problem,
    default_attention,
    extra_problem,
    hub_config,
    model_class,
    read_config_file,
    spec_values,
)
from ..sources.corpus import CorpusError, check_available
from .keys import (
    AXES,
    DATA_KEYS,
    MAX_CROSSED,
    MAX_LAYERS,
    MODEL_DIMS,
    MODEL_SOURCES,
    SETUP_AXES,
    STRATEGY_AXES,
    TABLES,
    SuiteError,
    _Checker,
    _is,
    compute_dtype,
)
from .setup import setups, train_spec
from .strategy import offload_point, strategies


def _source(ck: _Checker, table: dict) -> dict:
    """The model's starting values from its one source: a preset, a config file, a hub name, or a
    model_type (family) with every dimension given."""
    given = [k for k in MODEL_SOURCES if k in table and not (k == "family" and "model_type" in table)]
    if len(given) > 1 and not (set(given) == {"preset", "family"}):
        ck.fail(f"model.{given[1]}", f"give one model source, not both {given[0]} and {given[1]}")
    if "preset" in table:
        if table["preset"] not in PRESETS:
            ck.fail("model.preset", f"unknown preset {table['preset']!r}; known: {', '.join(sorted(PRESETS))}")
        return asdict(preset(table["preset"]))
    if "config" in table or "hub" in table:
        key = "config" if "config" in table else "hub"
        try:
            data = (read_config_file(_near(ck.path, table["config"])) if key == "config"
                    else hub_config(table["hub"]))
            return {**spec_values(data), "name": os.path.basename(str(table[key]).rstrip("/"))}
        except ConfigError as exc:
            ck.fail(f"model.{key}", str(exc))
    family = table.get("model_type", table.get("family"))
    if family is None:
        ck.fail("model.family", "missing: give model.preset, model.config, model.hub, or model_type and the "
                f"dimensions ({', '.join(NEEDED)})")
    return {"family": family, "name": table.get("label", ""), "max_positions": 2048}


NEEDED = [k for k in MODEL_DIMS if k not in ("kv_heads", "max_positions")]  # kv_heads defaults to heads


def _given_dims(ck: _Checker, table: dict, values: dict, cls) -> None:
    """A model_type source's dimensions: each one its config class has a key for must be given; one it has
    none for (gpt2's key/value heads, MPT's MLP width) is what the model makes of the others."""
    missing = [k for k in NEEDED if k not in table and cls.dim_keys.get(k) is not None]
    if missing:
        ck.fail(f"model.{missing[0]}", "missing: give model.preset, model.config, model.hub, or model_type and "
                f"the dimensions ({', '.join(k for k in NEEDED if cls.dim_keys.get(k) is not None)})")
    values.setdefault("kv_heads", table.get("kv_heads", table["heads"]))
    values.setdefault("intermediate", 4 * table["hidden"])


def _near(suite_path: str, path: str) -> str:
    """A config path as written, or relative to the suite file when that is where it is."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    beside = os.path.join(os.path.dirname(suite_path), path)
    return beside if os.path.exists(beside) else path


def _model(ck: _Checker, table: dict, device: str, precisions: list | None = None) -> tuple[ModelSpec, str, list]:
    """The model, when the suite names no attention which one transformers' default gives and why, and the
    precisions the points run in (the sweep's axis, else the model's precision or dtype)."""
    values = _source(ck, table)
    source = dict(values)
    for key in ("family", "dtype", "attn", "tie_embeddings", "dropout", *MODEL_DIMS):
        if key in table and not (key == "family" and "preset" not in table and "model_type" in table):
            values[key] = table[key]
    if "model_type" in table and "preset" in table:
        values["family"] = table["model_type"]
    problem = extra_problem(table.get("extra", {}))
    if problem:
        ck.fail(f"model.extra.{problem[0]}", problem[1])
    extra = {**json.loads(values.get("config") or "{}"), **table.get("extra", {})}
    if "label" in table:
        values["name"] = table["label"]
    family_key = "model.model_type" if "model_type" in table else "model.family"
    try:
        cls = model_class(values["family"])
    except ConfigError as exc:
        ck.fail(family_key, str(exc))
    if not cls.known:
        ck.fail(family_key, f"transformers knows no causal LM of model_type {values['family']!r}")
    if "hidden" not in source:  # a model_type with its dimensions
        _given_dims(ck, table, values, cls)
    try:  # per-layer lists (layer_types ...) follow the depth
        values["config"] = canonical_config(at_depth(extra, values["layers"]))
    except ConfigError as exc:
        ck.fail("model.layers", str(exc))
    if values.get("dtype", "fp32") not in DTYPES:
        ck.fail("model.dtype", f"unknown dtype {values['dtype']!r}; known: {', '.join(DTYPES)} (mixed "
                "precision: model.precision)")
    if "precision" in table and "dtype" in table:
        ck.fail("model.precision", "give precision or its pure alias dtype, not both")
    if precisions is None:  # the [model] precision (or dtype), when the sweep has no precision axis
        precisions = [table.get("precision", values.get("dtype", "fp32"))]
    for p in precisions:
        if p not in PRECISIONS:
            ck.fail("sweep.precision" if "precision" not in table else "model.precision",
                    f"unknown precision {p!r}; known: {', '.join(PRECISIONS)}")
    attn_note = ""
    if "attn" not in table:
        # the dtype attention computes in; fp32 anywhere in the sweep decides (see default_attention)
        compute = "fp32" if any(compute_dtype(p) == "fp32" for p in precisions) else compute_dtype(precisions[0])
        values["attn"], attn_note = default_attention(values["family"], device, compute, cls.supports_sdpa)
    if values.get("dropout", "off") not in DROPOUTS:
        ck.fail("model.dropout", f"unknown dropout {values['dropout']!r}; known: {', '.join(DROPOUTS)} "
                "(off: every dropout probability 0; published: the config's own)")
    if values.get("attn", "eager") not in ATTENTIONS:
        ck.fail("model.attn", f"unknown attention implementation {values['attn']!r}; known: {', '.join(ATTENTIONS)}")
    for key in MODEL_DIMS:
        ck.positive(f"model.{key}", values[key])
    if values["layers"] > MAX_LAYERS:
        ck.fail("model.layers", f"{values['layers']:,} layers is more than {MAX_LAYERS:,}: no model that trains "
                "is that deep")
    if values["hidden"] % values["heads"]:
        ck.fail("model.heads", f"heads={values['heads']} does not divide hidden={values['hidden']}")
    if values["heads"] % values["kv_heads"]:
        ck.fail("model.kv_heads", f"kv_heads={values['kv_heads']} does not divide heads={values['heads']}")
    for dim in MODEL_DIMS:  # a size no config key holds cannot reach the model
        if cls.dim_keys.get(dim) is not None or dim not in table:
            continue
        has = source.get(dim, values["heads"] if dim == "kv_heads" else None)
        if table[dim] != has:
            ck.fail(f"model.{dim}", f"model_type {values['family']!r} has no config key for the {DIM_WORDS[dim]}, "
                    f"so {table[dim]} would not reach the model" + (f" (it has {has})" if has else "")
                    + f"; leave model.{dim} out")
    spec = ModelSpec(**values)
    if spec.config or spec.family not in FAMILIES:  # what transformers would refuse, refused here
        try:
            problem = build_problem(spec, tuple(table.get("extra", {})))
        except ConfigError as exc:
            ck.fail(family_key, str(exc))
        if problem:
            source_key = next((k for k in MODEL_SOURCES if k in table), "family")
            ck.fail(f"model.{problem[0] or source_key}", problem[1])
    return spec, attn_note, precisions


def _data(ck: _Checker, table: dict, model: ModelSpec) -> DataSpec:
    """The ``[data]`` table: which corpus, and its keys only where they mean something."""
    source = table.get("source", "random")
    if source not in DATA_SOURCES:
        ck.fail("data.source", f"unknown source {source!r}; known: {', '.join(DATA_SOURCES)}")
    only = {"path": ("file",), "name": ("dataset",), "config": ("dataset",), "split": ("dataset",),
            "column": ("dataset",), "eval_every": ("stdlib", "file", "dataset"),
            "eval_batches": ("stdlib", "file", "dataset")}
    for key, sources in only.items():
        if key in table and source not in sources:
            ck.fail(f"data.{key}", f"means nothing for source {source!r} (only for {' or '.join(sources)})")
    if source == "file" and not table.get("path"):
        ck.fail("data.path", "missing: source 'file' reads the text file named here")
    if source == "dataset" and not table.get("name"):
        ck.fail("data.name", "missing: source 'dataset' reads the datasets cache entry named here")
    for key in ("eval_every", "eval_batches"):
        if key in table:
            ck.positive(f"data.{key}", table[key], allow_zero=key == "eval_every")
    if source != "random" and model.vocab < BYTE_VOCAB:
        ck.fail("model.vocab", f"text sources are byte-level ({BYTE_VOCAB} token ids); the model's vocab "
                f"is {model.vocab}")
    values = {k: v for k, v in table.items() if k in DATA_KEYS}
    if source == "file":  # absolute: the ranks run in their own directory
        values["path"] = os.path.abspath(_near(ck.path, table["path"]))
    return DataSpec(**values)


# [suite] name: the default --out is results/<name>-<time>, so a plain directory name inside results/
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


def _name(ck: _Checker, suite: dict, path: str) -> str:
    """The suite's name, or its file's when it gives none (a file name is no path: nothing to check)."""
    if "name" not in suite:
        return os.path.splitext(os.path.basename(path))[0]
    if not NAME.fullmatch(suite["name"]):
        ck.fail("suite.name", "must be 1 to 100 letters, digits, '.', '_' or '-', not starting with '.' "
                f"(it names the results directory), got {suite['name']!r}")
    return suite["name"]


def launcher_available() -> bool:
    """torchrun found (:func:`~ckptbench.base.env.torchrun_path`): needed for Cases with world_size > 1."""
    return torchrun_path() is not None


def _slurm(ck: _Checker, table: dict) -> dict:
    """The ``[slurm]`` table, checked: sizes and the time limit positive, setup a list of shell lines."""
    for key in ("time_min", "gpus_per_task", "cpus_per_task", "mem_gib", "jobs", "array_parallelism"):
        if key in table:
            ck.positive(f"slurm.{key}", table[key], allow_zero=key == "gpus_per_task")
    if not all(isinstance(line, str) for line in table.get("setup", [])):
        ck.fail("slurm.setup", f"must be a list of shell lines (strings), got {table['setup']!r}")
    return dict(table)


def parse_suite(text: str, path: str = "<suite>") -> Suite:
    ck = _Checker(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(path, "(file)", f"invalid TOML: {exc}") from None
    for key in data:
        if key not in TABLES:
            ck.fail(key, f"unknown table; allowed: {', '.join(f'[{t}]' for t in TABLES)}")
    suite = ck.table(data, "suite")
    name = _name(ck, suite, path)
    sweep = ck.table(data, "sweep")
    axes = {key: ck.axis(sweep, key) for key in AXES}
    model, attn_note, axes["precision"] = _model(ck, ck.table(data, "model"), suite.get("device", "cpu"),
                                                 axes["precision"] or None)
    train_table = ck.table(data, "train")
    train = train_spec(ck, train_table, suite.get("timeout_s", 300.0))
    axes["seed"] = axes["seed"] or [train.seed]
    data_spec = _data(ck, ck.table(data, "data"), model)
    if data_spec.source != "random" and min(axes["world_size"]) == 1:
        ck.fail("data.source", f"{data_spec.source!r} trains the data-parallel loop (world_size > 1); "
                "single-process points measure memory and time on random tokens")

    device = suite.get("device", "cpu")
    if device not in DEVICES:
        ck.fail("suite.device", f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    point_setups = setups(ck, axes, train_table, device, model.attn)
    point_strategies = strategies(ck, sweep, axes, model.layers)
    if max(axes["local_sgd_steps"]) > 0 and max(axes["world_size"]) == 1:
        ck.fail("sweep.local_sgd_steps", "local SGD needs world_size > 1 (add it to sweep.world_size)")
    for impl in axes["sync_impl"]:
        if impl not in SYNC_IMPLS:
            ck.fail("sweep.sync_impl", f"unknown averaging {impl!r}; known: {', '.join(SYNC_IMPLS)}")
    if max(axes["world_size"]) > 1 and not launcher_available():
        ck.fail("sweep.world_size", "world_size > 1 needs torchrun, which was not found")
    if min(axes["seq_len"]) < 2:
        ck.fail("sweep.seq_len", "must be >= 2: a causal LM predicts token t+1 from tokens up to t")
    if max(axes["seq_len"]) > model.max_positions:
        ck.fail("sweep.seq_len", f"{max(axes['seq_len'])} exceeds model.max_positions={model.max_positions}")
    for key in ("timeout_s", "memory_budget_gib", "repeats"):
        if key in suite:
            ck.positive(f"suite.{key}", suite[key])
    budgets = suite.get("budgets_gib", [])
    if not all(_is(b, (int, float)) and math.isfinite(b) and b > 0 for b in budgets):
        ck.fail("suite.budgets_gib", f"must be positive numbers, got {budgets!r}")

    rest = [a for a in AXES if a != "seed" and a not in SETUP_AXES and a not in STRATEGY_AXES]
    crossed = (len(axes["seed"]) * len(point_setups) * len(point_strategies)
               * math.prod(len(axes[a]) for a in rest))
    if crossed > MAX_CROSSED:  # counted before a single Case is built: 10^4 × 10^4 would not fit in memory
        widest = max(AXES, key=lambda a: len(axes[a]))
        ck.fail(f"sweep.{widest}", f"the axes cross to {crossed:,} points (more than {MAX_CROSSED:,}); "
                "split the sweep into several suites")
    cases = []
    # seed outermost: a sweep cut short still holds every K of the seeds it reached
    # the strategy (every_n_layers, a layer set, a SAC policy) crosses where every_n_layers alone did
    batch_seq, after = [axes[a] for a in rest[:2]], [axes[a] for a in rest[2:]]
    # one model per dtype and one train table per seed, shared by the points (they are frozen): a million
    # points built two copies each before
    models = {dtype: replace(model, dtype=dtype) for dtype, _ in point_setups}
    trains = {seed: replace(train, seed=seed) for seed in axes["seed"]}
    for seed, (dtype, setup), (b, s, (n, recompute), off, k, ga, ws, impl) in itertools.product(
            axes["seed"], point_setups, itertools.product(*batch_seq, point_strategies, *after)):
        # meaningless pairs: offload with nothing checkpointed, local SGD on one process, and an
        # averaging implementation where nothing is averaged (plain DDP or a single process), and a choice
        # of loop for a multi-rank point (which always runs accelerate's data-parallel loop), and a sharding
        # where nothing is shared out (one rank) or parameters are averaged (local SGD averages whole models)
        if (off and n == 0 and not recompute.layers) or (k > 0 and ws == 1) or (impl != "accelerate" and k == 0) or \
                (setup.loop != "manual" and ws > 1) or (setup.sharding != "ddp" and (ws == 1 or k > 0)):
            continue
        off, recompute = offload_point(off, recompute)  # true, false or a kind ("streamed")
        cases.append(Case(model=models[dtype], train=trains[seed], batch_size=b,
                          seq_len=s, every_n_layers=n, offload=off, local_sgd_steps=k, grad_accum=ga,
                          world_size=ws, device=device, sync_impl=impl, data=data_spec, setup=setup,
                          recompute=recompute))
    budget = suite.get("memory_budget_gib")
    return Suite(
        name=name,
        path=path,
        cases=tuple(cases),
        timeout_s=float(suite.get("timeout_s", 300.0)),
        memory_budget_bytes=int(budget * 2**30) if budget else None,
        budgets_gib=tuple(float(b) for b in budgets),
        repeats=int(suite.get("repeats", 1)),
        text=text,
        attn_note=attn_note,
        slurm=_slurm(ck, ck.table(data, "slurm")),
    )


def load_suite(path: str) -> Suite:
    try:
        with open_regular(path, "r", encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise SuiteError(path, "(file)", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SuiteError(path, "(file)", f"not UTF-8 text: {exc.reason}") from None
    suite = parse_suite(text, path)
    if suite.cases:  # the corpus must be here before any worker starts (a report re-reads suites without it)
        try:
            check_available(suite.cases[0].data)
        except CorpusError as exc:
            raise SuiteError(path, exc.key, exc.reason) from None
    return suite
