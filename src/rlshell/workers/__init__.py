"""Workers of the reasoning runner: actor (FSDP2, collocated rollout), rollout, reference."""
