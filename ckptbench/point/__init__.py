"""What a sweep point is, typed and torch-free: the Case (:mod:`.case`), its [train] settings
(:mod:`.training`), how it is trained (:mod:`.setup`), which layers and operators it recomputes
(:mod:`.strategy`), and the facts plan reads by name (:mod:`.cards`, :mod:`.preset_sizes`)."""
