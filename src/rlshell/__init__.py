"""rlshell: the imperative shell that wires rlcore into Ray worker groups.

Config and CLI, cluster placement, FSDP/Megatron actors, HF/vLLM/SGLang
rollout, reward and env workers, weight sync, runners, metrics and
checkpoints live here. The shell never re-implements maths: losses,
advantages and rollout transforms come from `rlcore`.
"""

__version__ = "0.1.0"
