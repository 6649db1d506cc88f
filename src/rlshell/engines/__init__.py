"""Engines: what a worker drives to do its job, behind one small protocol per kind.

- `rlshell.engines.rollout`: rollout engines (prompts in, a `RolloutBatch`
  out): Hugging Face ``generate`` and vLLM, and any registered plug-in;
- `rlshell.engines.training`: training backends (a sharded model and its
  optimizer): FSDP2 and Megatron-core, and any registered plug-in.

Each kind is a registry (`rlshell.engines.plugins` says what an entry carries: its
packages, rules, the keys it reads, its options); a run picks each engine once, by
name from its config, and workers hold them.
"""
