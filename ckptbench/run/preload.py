"""Imported once by the workers' fork server, so that forked workers start warm.

transformers imports about 160 modules lazily the first time a model is built from a config
(generation utilities, integrations, initialisation helpers): a third of a second that every fresh
worker would otherwise pay again.  Building one model of each family on the ``meta`` device pulls them
in without allocating memory or running a kernel, so no thread pool is started in the fork server
(forking after OpenMP has run is unsafe) and CUDA is never touched.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from ..spec.case import FAMILIES, preset
from ..train.models import hf_config


def warm() -> None:
    for family in FAMILIES:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(hf_config(preset(f"{family}-tiny")), attn_implementation="eager")


warm()
