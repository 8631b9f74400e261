"""Where a point's model and data come from: a config.json, hub name or model_type read to ModelSpec
values (:mod:`.configs`), transformers' answers about a model kept on disk (:mod:`.answers`), and the text
a point learns from (:mod:`.corpus`)."""
