"""Engines: what a worker drives to do its job, behind one small protocol per kind.

- `rlshell.engines.rollout`: rollout engines (prompts in, a `RolloutBatch`
  out): Hugging Face ``generate`` today;
- `rlshell.engines.training`: training backends (a sharded model and its
  optimizer): FSDP2 today.

A run picks each engine once, from its resolved run spec; workers hold them.
"""
