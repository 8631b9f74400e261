"""Parameter count of each preset as transformers builds it (written by scripts/preset_sizes.py;
tests/unit/test_models.py holds it to the built models)."""

PARAMS = {
    'llama-tiny': 180800,
    'llama-small': 3426560,
    'llama-1b': 1235814400,
    'llama-8b': 8030261248,
    'qwen2-tiny': 181312,
    'qwen2-0.5b': 494032768,
    'gpt2-tiny': 298368,
    'gpt2': 124439808,
    'llama-70b': 70553706496,
    'smollm2-135m': 134515008,
    'smollm2-1.7b': 1711376384,
    'qwen2.5-0.5b': 494032768,
    'qwen2.5-7b': 7615616512,
    'mistral-7b': 7241732096,
    'mixtral-8x7b': 46702792704,
    'qwen3-8b': 8190735360,
    'gemma2-2b': 2614341888,
    'gemma2-9b': 9241705984,
    'gemma3-1b': 999885952,
    'phi3-mini': 3821079552,
    'phi4-mini': 3836021760,
    'olmo2-1b': 1484916736,
    'pythia-160m': 162322944,
}
