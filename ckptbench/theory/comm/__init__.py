"""What data-parallel training moves and waits for: collective payloads, FSDP2's shards per rank, the α–β
network projection, and how much of the communication compute hides."""
