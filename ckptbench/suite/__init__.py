"""Suite files: TOML in, validated Cases out (:mod:`.parse`), the keys a file may hold and the error that
names a wrong one (:mod:`.keys`), the [train] table and setup axes (:mod:`.setup`), the checkpointing axes
(:mod:`.strategy`)."""
