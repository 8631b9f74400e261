"""Imported once by the workers' fork server, so that forked workers start warm.

transformers imports about 160 modules lazily the first time a model is built from a config
(generation utilities, integrations, initialisation helpers): a third of a second that every fresh
worker would otherwise pay again.  Building one model of each family on the ``meta`` device pulls them
in without allocating memory or running a kernel, so no thread pool is started in the fork server
(forking after OpenMP has run is unsafe) and CUDA is never touched.  Then every object alive is frozen
out of the garbage collector's generations (``gc.freeze``), so that the collection each memory step
starts with is paid on the worker's own objects only.
"""

from __future__ import annotations

import gc

import torch
from transformers import AutoModelForCausalLM

from ..point.case import FAMILIES, preset
from ..train.models import hf_config


def warm() -> None:
    for family in FAMILIES:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(hf_config(preset(f"{family}-tiny")), attn_implementation="eager")


warm()
# Every object alive now (torch's, transformers', the modules warm() pulled in) leaves the collector's
# generations for good: a worker's memory step begins with a full collection (measure/memory.py), which
# then walks only what the worker made, not the server's whole heap (0.13 s a point on a 2-core EPYC).
# Garbage among them is collected first; what is frozen is alive, so no free is hidden from a step.
gc.collect()
gc.freeze()
