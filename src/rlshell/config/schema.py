"""The typed configuration: one attrs frozen class per component.

A config file is a Python module that defines ``config``, a `Config`
(`configs/grpo.py` is the default). `rlshell.config.loading` applies
``key.path=value`` overrides, checks everything and reports every problem
at once; this module only declares the fields, their defaults, and the
per-field constraints (``metadata=checked(...)``) that the loader applies
with each field's full key path.

Registry-backed names (``actor.model.model_type``, ``reward.reward_type``,
``env.env_type``, ``algorithm.adv_type``, ``algorithm.loss_type``) are plain
strings here and are checked against the registries when the config is
validated, so names registered by an extension module are accepted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Literal

import attrs
from attrs import Factory, field, frozen

__all__ = [
    "COMPONENTS",
    "ActorConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "ClusterConfig",
    "Config",
    "DataConfig",
    "EnvConfig",
    "FSDPConfig",
    "LoggerConfig",
    "MegatronConfig",
    "ModelConfig",
    "ModelOption",
    "NodeGroupEntry",
    "NodeGroupEnvConfig",
    "NodeHardwareConfig",
    "OptimConfig",
    "PlacementEntry",
    "Precision",
    "RewardConfig",
    "RolloutConfig",
    "RunnerConfig",
    "SACConfig",
    "WrapPolicyConfig",
    "checked",
    "field_problems",
]

# The components a placement can name, in the order plans list them.
COMPONENTS = ("actor", "rollout", "reference", "critic", "reward", "env")

Precision = Literal["fp32", "bf16", "fp16"]
ModelOption = int | float | bool | str | None | list["ModelOption"] | dict[str, "ModelOption"]
"""A value of ``actor.model.model_kwargs``: what a YAML or JSON value can be (a number, a
string, a boolean, null, or a list or mapping of these, nested to any depth)."""
# rlcore.masked.AggregationMode, rlcore.losses.KLKind's names without the aliases, and
# rlcore.advantages.BaselineForm (tests/shell/test_config.py checks they agree).
AggregationMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
KLKind = Literal["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"]
BaselineForm = Literal["reward_to_go", "score"]
OldLogprobs = Literal["recompute", "rollout"]
# rlcore.mismatch.RolloutISMode (tests/shell/test_config.py checks they agree).
RolloutISMode = Literal[
    "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_mask"
]

Check = Callable[[Any], bool]
CHECK_KEY = "rlshell.check"


def checked(predicate: Check, expected: str) -> dict[str, tuple[Check, str]]:
    """Field metadata: ``predicate(value)`` must hold, else "expected {expected}"."""
    return {CHECK_KEY: (predicate, expected)}


def _finite(value: float) -> bool:
    return math.isfinite(value)


POSITIVE = checked(lambda v: _finite(v) and v > 0, "a positive number")
NON_NEGATIVE = checked(lambda v: _finite(v) and v >= 0, "a number ≥ 0")
POSITIVE_INT = checked(lambda v: v >= 1, "an integer ≥ 1")
NON_NEGATIVE_INT = checked(lambda v: v >= 0, "an integer ≥ 0")
UNIT_OPEN_CLOSED = checked(lambda v: _finite(v) and 0 < v <= 1, "a number in (0, 1]")
UNIT_CLOSED = checked(lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]")
FINITE_VALUES = checked(
    lambda v: all(_finite(x) for x in v.values()), "a mapping of names to finite numbers"
)
OPTIONAL_POSITIVE = checked(lambda v: v is None or (_finite(v) and v > 0), "null or > 0")
LORA_TARGETS = checked(
    lambda v: (
        all(name and name == name.strip() for name in v) and ("all-linear" not in v or len(v) == 1)
    ),
    "module-name suffixes (e.g. ['q_proj', 'v_proj']), or ['all-linear'] alone",
)


@frozen
class PlacementEntry:
    """A component's placement in its long form (the short form is the string alone).

    ``placement`` uses RLinf's syntax (`rlshell.cluster.placement`); ``node_group`` a
    label from ``cluster.node_groups``; ``cpus_per_worker`` overrides the
    component's own setting.
    """

    placement: str
    node_group: str = "all"
    cpus_per_worker: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)


WORKER_MALLOC_ENV: dict[str, str] = {
    # glibc returns freed heap memory to the OS above a trim threshold, and serves
    # allocations above a (dynamic) mmap threshold with fresh mappings: each step's
    # activations are then page-faulted in again (~8-25% of a small model's update
    # here, in the kernel). Keep freed memory for reuse: mappings only above 32 MiB,
    # trimming only above 1 GiB.
    "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
    "MALLOC_TRIM_THRESHOLD_": str(2**30),
}
"""Allocator settings every worker starts with unless ``cluster.worker_env_vars`` says otherwise."""


@frozen
class NodeGroupEnvConfig:
    """The software environment of a node group's workers on some of its nodes (RLinf's
    ``env_configs`` entry).

    ``node_ranks``: the nodes it applies to (``"0-1"``), a subset of the group's, no node in
    two entries of a group; null: every node of the group. ``env_vars``: set in every worker
    placed on this group on those nodes (over ``cluster.worker_env_vars``);
    ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` here name the interface collectives use
    on those nodes, over ``cluster.comm_net_devices``. ``python_interpreter_path``: the
    Python those workers run (Ray's ``py_executable``), an executable file on those nodes.
    """

    node_ranks: str | None = None
    env_vars: dict[str, str] = Factory(dict)
    python_interpreter_path: str | None = None


@frozen
class NodeHardwareConfig:
    """A node group's hardware (RLinf's ``hardware``): its ``type`` and per-device ``configs``.

    rlstack honours ``type: Accelerator`` (RLinf's name for GPUs: every node of the group
    must have one, the plan records it, and the components that use GPUs count the group's
    GPUs as its resources) and refuses the robot types RLinf drives (``Franka``,
    ``DualFranka``, ...) with the reason.
    """

    type: str
    configs: tuple[dict[str, Any], ...] = ()


@frozen
class NodeGroupEntry:
    """A node group in its long form, as RLinf writes one (the short form is ``node_ranks``
    alone): its nodes, the environment of the workers placed on it, its hardware."""

    node_ranks: str
    env_configs: tuple[NodeGroupEnvConfig, ...] = ()
    hardware: NodeHardwareConfig | None = None


@frozen
class ClusterConfig:
    """Where the run happens.

    ``address``: null starts an embedded Ray (this machine); ``"auto"`` or
    ``"ray://host:10001"`` attaches to a cluster started with ``ray start``.
    ``simulate``: ``"NxG"`` (or ``"NxGxC"``) plans for N nodes × G GPUs (× C
    CPUs) instead of the real machine; only valid with ``--dry-run``.
    ``component_placement`` maps component names (comma-joined names share a
    placement) to a placement string or a `PlacementEntry`. ``node_groups``
    maps labels to node ranks (``{"a800": "0-1"}``) or, on an attached
    cluster, to a Ray node label (``{"cpu": "pool=cpu"}``: the nodes started
    with ``ray start --labels=pool=cpu``); a `NodeGroupEntry` gives a group its
    workers' environment variables and interpreter (``env_configs``) and its
    ``hardware`` as RLinf does. ``worker_env_vars`` are
    set in every worker process; the default keeps glibc from handing freed
    memory back to the OS between steps (`WORKER_MALLOC_ENV`),
    ``{}`` starts workers with the driver's allocator settings.
    ``comm_net_devices``: the network interface(s) collectives use (RLinf's
    ``RLINF_COMM_NET_DEVICES``, read when this is null): ``GLOO_SOCKET_IFNAME``
    and ``NCCL_SOCKET_IFNAME`` of every worker; each name must be an interface
    of the nodes the workers run on, checked before they start.
    """

    address: str | None = None
    num_nodes: int = field(default=1, metadata=POSITIVE_INT)
    simulate: str | None = None
    num_cpus: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    component_placement: dict[str, str | PlacementEntry] = Factory(
        lambda: {"actor,rollout": "0:0-1", "reward": "0"}
    )
    node_groups: dict[str, str | NodeGroupEntry] = Factory(dict)
    startup_timeout_s: float = field(default=120.0, metadata=POSITIVE)
    call_timeout_s: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    worker_env_vars: dict[str, str] = Factory(lambda: dict(WORKER_MALLOC_ENV))
    comm_net_devices: str | None = None


@frozen
class ModelConfig:
    """Which model to build: a registered ``model_type`` and what its builder reads.

    ``path`` is a local Hugging Face directory or a Hub id (``org/name``,
    read through the Hub cache, downloaded only without ``HF_HUB_OFFLINE``;
    `rlshell.hub`); without it builders construct the model from
    ``model_kwargs`` (e.g. a transformers config's fields). ``model_kwargs``
    values are `ModelOption`s (lists and nested mappings too, as RLinf's model
    sections have them); the builder reads them: ``hf_causal_lm`` hands them to
    ``from_pretrained`` (or the config class) and types the loading options it
    knows (`rlshell.models.pretrained_options`).
    ``tokenizer_path``: a local tokenizer directory or Hub id; by default the
    model's own (``path``), or, for a model built from ``model_kwargs``, the
    project's character tokenizer built into the run directory.
    ``is_lora``: train LoRA adapters of rank ``lora_rank`` and scale
    ``lora_alpha`` / ``lora_rank`` (null α: α = rank, scale 1) instead of the
    weights, which stay frozen (`rlshell.models.lora`); they go on the layers
    ``lora_target_modules`` names (module-name suffixes such as ``q_proj``,
    or ``all-linear``: every linear layer but the output head), or, when it
    is empty, on the model's own choice (``hf_causal_lm``: ``all-linear``).
    ``checkpoint``: a checkpoint directory of an earlier run
    (``<run dir>/checkpoints/global_step_N``, an SFT run's say) whose policy
    weights the model starts from, in every copy the run builds (actor,
    rollout, reference), instead of ``path``'s or the seed's; its optimizer,
    step and sampler stay behind. The run uses the checkpoint's tokenizer
    unless ``tokenizer_path`` is set. ``model_kwargs`` (or ``path``) must
    build the architecture the checkpoint holds. The directory is read
    whenever the model is built, a resume included (the reference policy is
    the checkpoint's).
    """

    model_type: str = "hf_causal_lm"
    category: Literal["reasoning", "embodied"] = "reasoning"
    path: str | None = None
    tokenizer_path: str | None = None
    precision: Precision = "fp32"
    model_kwargs: dict[str, ModelOption] = Factory(dict)
    is_lora: bool = False
    lora_rank: int = field(default=8, metadata=POSITIVE_INT)
    lora_alpha: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    lora_target_modules: tuple[str, ...] = field(default=(), metadata=LORA_TARGETS)
    gradient_checkpointing: bool = False
    checkpoint: str | None = None


@frozen
class OptimConfig:
    """AdamW and its learning-rate schedule.

    ``fused``: torch's fused AdamW kernel (one kernel for all parameters, on
    CPU and CUDA) instead of a Python loop over them; the same update up to
    floating-point rounding order.
    """

    lr: float = field(default=3e-4, metadata=POSITIVE)
    weight_decay: float = field(default=0.0, metadata=NON_NEGATIVE)
    adam_beta1: float = field(default=0.9, metadata=UNIT_CLOSED)
    adam_beta2: float = field(default=0.999, metadata=UNIT_CLOSED)
    adam_eps: float = field(default=1e-8, metadata=POSITIVE)
    clip_grad: float | None = field(default=1.0, metadata=OPTIONAL_POSITIVE)
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    lr_warmup_steps: int = field(default=0, metadata=NON_NEGATIVE_INT)
    min_lr_ratio: float = field(default=0.0, metadata=UNIT_CLOSED)
    fused: bool = True


@frozen
class WrapPolicyConfig:
    """What FSDP shards as units (names as RLinf spells them).

    Modules whose class name is in ``transformer_layer_cls_to_wrap`` or
    ``module_classes_to_wrap``, or whose ``_fsdp_wrap_name`` is in
    ``no_split_names``, become FSDP units; with all three empty the model's
    ``_no_split_modules`` is used. ``min_num_params`` (verl's name) keeps only
    units holding at least that many parameters: each unit costs collectives
    per pass, which a small model does not repay (with no unit left the whole
    model is one, the root).
    """

    transformer_layer_cls_to_wrap: tuple[str, ...] = ()
    module_classes_to_wrap: tuple[str, ...] = ()
    no_split_names: tuple[str, ...] = ()
    min_num_params: int = field(default=0, metadata=NON_NEGATIVE_INT)


@frozen
class FSDPConfig:
    """FSDP2 settings: wrapping, mixed precision, resharding."""

    wrap_policy: WrapPolicyConfig = Factory(WrapPolicyConfig)
    mixed_precision: Precision = "fp32"
    reshard_after_forward: bool = True


@frozen
class MegatronConfig:
    """Megatron-core parallelism for ``actor.backend=megatron``.

    The actor's ranks form a grid of ``tensor_model_parallel_size`` ×
    ``pipeline_model_parallel_size`` × data-parallel replicas (the rest of the
    actor's ranks): tensor ranks split each layer (whole key/value head groups,
    MLP columns, vocabulary rows), pipeline stages hold consecutive layers and
    run Megatron's 1F1B schedule over the update's micro-batches. The other
    four keys name Megatron features this backend does not build; each is
    refused when set (context and expert parallelism, sequence parallelism,
    the distributed optimizer).
    """

    tensor_model_parallel_size: int = field(default=1, metadata=POSITIVE_INT)
    pipeline_model_parallel_size: int = field(default=1, metadata=POSITIVE_INT)
    context_parallel_size: int = field(default=1, metadata=POSITIVE_INT)
    expert_model_parallel_size: int = field(default=1, metadata=POSITIVE_INT)
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False


@frozen
class ActorConfig:
    """The trained policy: model, optimizer, FSDP and the micro-batch budget.

    ``backend``: the registered training backend
    (`rlshell.engines.training.TRAINING_BACKENDS`: ``fsdp``, ``megatron``; a plug-in
    registers its own with `rlshell.engines.training.register_training_backend`).
    ``enable_offload``: null (auto) moves the optimizer state and, unless
    ``rollout.weight_sync`` is ``shared``, the parameters to host memory while
    the rollout generates, wherever the plan has the actor time-share a GPU
    with the rollout, and does nothing elsewhere; true asks for that and is
    refused where there is no such GPU; false never offloads and refuses a
    plan whose actor shares a GPU (`rlshell.runners.offload`).
    ``compile``: the collocated embodied PPO runner's update runs each
    minibatch's whole step (forward, rlcore's losses, backward, gradient-norm
    clip, AdamW) as one inductor-compiled graph
    (`rlshell.workers.embodied_update.CompiledPPOStep`), compiled at worker
    start-up (seconds); same maths to float rounding, about 1.7× faster per
    step on a small MLP policy. One unsharded actor rank with a ``gae``
    estimator only; other runners and placements refuse it.
    """

    model: ModelConfig = Factory(ModelConfig)
    optim: OptimConfig = Factory(OptimConfig)
    fsdp_config: FSDPConfig = Factory(FSDPConfig)
    backend: str = "fsdp"
    megatron: MegatronConfig = Factory(MegatronConfig)
    micro_batch_max_tokens: int = field(default=4096, metadata=POSITIVE_INT)
    # Prompts (each with its algorithm.group_size samples) per optimizer step of the
    # reasoning runner's update; null: the whole batch, one step per epoch.
    mini_batch_size: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    logprob_chunk_size: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    # Rows repeating a prompt (a group's samples) run it once in the update's forward.
    share_prompt_forward: bool = True
    # The update's forward and backward run each micro-batch's valid tokens end to end in one
    # row (no padding); every row runs its own prompt there, in share_prompt_forward's place.
    pack_sequences: bool = False
    enable_offload: bool | None = None
    cpus_per_worker: float = field(default=0.5, metadata=POSITIVE)
    # The frozen reference (KL term) runs beside the actor and only computes
    # log-probs between the actor's phases, so it reserves little CPU.
    reference_cpus_per_worker: float = field(default=0.125, metadata=POSITIVE)
    seed: int = 0
    compile: bool = False


@frozen
class CriticOptimConfig(OptimConfig):
    """The critic's AdamW and schedule: `OptimConfig`'s fields, under ``critic.optim`` (a
    class of its own, so that the config-read tracer tells ``critic.optim.lr`` from
    ``actor.optim.lr``). A value head learns faster than the policy: lr 1e-3 by default."""

    lr: float = field(default=1e-3, metadata=POSITIVE)


@frozen
class CriticConfig:
    """The reasoning runner's value model, trained beside the actor when
    ``algorithm.adv_type='gae'`` (PPO with a critic).

    The model is the actor's transformer (``actor.model``'s kwargs, or
    ``model_path`` when set, else the actor's ``path``) with a one-output token
    head instead of the LM head (``hf_value_model``:
    ``AutoModelForTokenClassification``, ``num_labels=1``); the head starts from
    ``actor.seed``. It runs in worker processes of its own (placement key
    ``critic``, by default the actor's devices), sharded by FSDP2 as the actor is
    (``actor.fsdp_config``), stepped by AdamW with ``optim`` over the actor's
    epochs and mini-batches (``algorithm.ppo_epochs``, ``actor.mini_batch_size``),
    in micro-batches of ``micro_batch_max_tokens`` tokens. Its loss is rlcore's
    ``value_loss`` against the GAE returns, clipped around the values it
    predicted before the update by ``algorithm.value_clip``. ``warmup_steps``:
    the first that many steps train the critic only (the actor waits for
    values worth following; verl's ``critic_warmup``).
    """

    model_path: str | None = None
    optim: CriticOptimConfig = Factory(CriticOptimConfig)
    micro_batch_max_tokens: int = field(default=4096, metadata=POSITIVE_INT)
    warmup_steps: int = field(default=0, metadata=NON_NEGATIVE_INT)
    # Ray's reservation: the critic computes between and beside the actor's phases on the
    # actor's cores (by default), like the reference.
    cpus_per_worker: float = field(default=0.125, metadata=POSITIVE)


@frozen
class RolloutConfig:
    """Sampling: the engine, its parallelism, the sampling parameters and the weight sync.

    ``backend``: the registered rollout engine (`rlshell.engines.rollout.ROLLOUT_ENGINES`:
    ``hf``, ``vllm``; ``sglang`` is planned but not run here; a plug-in registers its
    own with `rlshell.engines.rollout.register_rollout_engine`). ``engine_options``:
    that engine's own options, checked against the record it registered (the built-in
    engines take none).
    ``precision``: the engine's weights (null: the actor model's
    ``precision``); the actor's weights are cast to it when synced, which is
    what makes ``patch`` small (few bf16 values change per optimizer step).
    ``weight_sync``: ``bucket`` sends every weight in flat buckets of
    ``bucket_size_mb``; ``patch`` sends only the entries that changed;
    ``shared`` keeps no copy at all: the hf engine generates with the actor's
    own FSDP module, its units gathered once per rollout (the rollout must
    share the actor's placement and precision).
    ``gpu_memory_utilization``: the share of a GPU a vllm engine reserves
    for its weights and KV cache (refused with the hf engine, which reads no
    such setting, and where the vllm engine runs on CPUs).
    ``min_new_tokens``: the training rollouts' responses get at least this many
    tokens (the EOS token is held back until then: vLLM's ``min_tokens``, HF's
    ``min_new_tokens``), at most ``max_new_tokens``; 0: the model decides. Evaluation
    never holds EOS back.
    ``cpu_kv_cache_mb``: the host memory a vllm engine on CPUs reserves for
    its KV cache (vLLM's ``kv_cache_memory_bytes``); it bounds how many
    sequences it decodes at once.
    ``enable_offload``: a rollout in processes of its own that time-shares
    the actor's GPUs moves its model to host memory during the update; null
    (auto) does that wherever the plan shares, true asks for it (refused where
    nothing shares), false never does and refuses a plan that shares.
    ``pipeline_stage_num``: embodied PPO in the hybrid placement (env, rollout
    and actor under keys of their own) splits each env worker's envs into this
    many stages, so that the rollout computes one stage's actions while the
    env worker steps another; 1 alternates them without overlap.
    ``compile``: the collocated embodied runner calls the policy's
    ``predict_action_batch`` once per env step as one inductor-compiled graph
    (`rlshell.models.compiled.CompiledPredict`), compiled at worker start-up:
    the same actions from the same seed, log-probs and values to float
    rounding. One unsharded actor rank; other runners and placements refuse it.
    ``partial_rollouts`` (the reasoning runner with ``runner.mode='async'``,
    the hf engine): new weights interrupt a generation in flight between two
    tokens; the worker applies them and continues the unfinished responses
    with them, recording which version sampled each token (AReaL's partial
    rollouts). Off, a worker switches versions only between two requests.
    """

    backend: str = "hf"
    precision: Precision | None = None
    tensor_parallel_size: int = field(default=1, metadata=POSITIVE_INT)
    temperature: float = field(default=1.0, metadata=POSITIVE)
    top_p: float = field(default=1.0, metadata=UNIT_OPEN_CLOSED)
    top_k: int = field(default=0, metadata=NON_NEGATIVE_INT)
    max_new_tokens: int = field(default=16, metadata=POSITIVE_INT)
    min_new_tokens: int = field(default=0, metadata=NON_NEGATIVE_INT)
    gpu_memory_utilization: float = field(default=0.5, metadata=UNIT_OPEN_CLOSED)
    cpu_kv_cache_mb: float = field(default=256.0, metadata=POSITIVE)
    enable_offload: bool | None = None
    weight_sync: Literal["bucket", "patch", "shared"] = "bucket"
    bucket_size_mb: float = field(default=64.0, metadata=POSITIVE)
    cpus_per_worker: float = field(default=0.25, metadata=POSITIVE)
    pipeline_stage_num: int = field(default=1, metadata=POSITIVE_INT)
    compile: bool = False
    partial_rollouts: bool = False
    engine_options: dict[str, int | float | str | bool] = Factory(dict)


@frozen
class RewardConfig:
    """Rule-based rewards from the reward registry, each call under a timeout.

    ``reward_type``: the correctness reward, whose mean on the held-out split
    is ``eval/accuracy``; alone, it is also the training reward. ``weights``:
    several rewards and their weights, name → weight, whose weighted total is
    the training reward (``{"math": 1.0, "format": 0.1, "length_penalty":
    0.1}``); each name is a registered reward or ``length_penalty`` (Kimi
    k1.5's, computed from token lengths), and ``reward_type`` must be one of
    them. Empty (the default): ``reward_type`` alone, with weight 1.
    ``max_failed_steps``: stop the run (exit status 1) once every call of one
    reward has failed (raised, timed out, crashed its process or returned a
    non-finite value) on that many consecutive training steps; 0 never stops.
    ``memory_mb``: how far each reward process's address space may grow past
    its size after start-up (null: no limit); a call that allocates past it
    fails as a reward error (MemoryError) or, if the process dies of it, a
    crash, and is scored and counted like any other failure. ``isolation``:
    ``sandbox`` (each reward process in a bubblewrap sandbox as a fresh
    unprivileged uid without network or writable files: `rlshell.isolation`;
    reward functions that run the model's code need it) or ``weak`` (processes
    of the trainer's user, with its environment; docs/security.md).
    """

    reward_type: str = "math"
    weights: dict[str, float] = field(factory=dict, metadata=FINITE_VALUES)
    timeout_s: float = field(default=5.0, metadata=POSITIVE)
    num_processes: int = field(default=1, metadata=POSITIVE_INT)
    cpus_per_worker: float = field(default=0.25, metadata=POSITIVE)
    max_failed_steps: int = field(default=3, metadata=NON_NEGATIVE_INT)
    memory_mb: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    isolation: Literal["sandbox", "weak"] = "sandbox"


@frozen
class AgentConfig:
    """Multi-turn, tool-using rollouts (reasoning runner) and the conversation format (SFT).

    ``tools``: registered tool names (`rlshell.tools`) the model may call;
    empty, a rollout is one prompt and one completion. With tools, a response
    is up to ``max_turns`` model turns: a turn that ends with a tool call
    (``call_start`` … ``call_end``, ``call_body`` ``plain``: ``name argument``,
    or ``json``: ``{"name": ..., "arguments": ...}``; ``default_tool`` may be
    called without its name) has the call run and its output appended as
    ``result_start`` … ``result_end``, and the model continues, until a turn
    ends without a call (the answer), the turn cap, or ``max_total_tokens``
    response tokens (model and tool tokens together; null: ``max_turns`` ×
    ``rollout.max_new_tokens``). Each turn generates at most
    ``rollout.max_new_tokens``. Tool outputs are context, not trained
    (`rlshell.rollout.RolloutBatch.loss_mask`).

    Tools run in sandbox processes (``num_tool_processes`` of them), each call
    under ``tool_timeout_s``, ``tool_memory_mb`` of address space, no network
    unless ``tool_network``, in a scratch directory, at most
    ``tool_max_processes`` processes at once; ``tool_isolation``: ``sandbox``
    (bubblewrap, seccomp, a uid and a cgroup per call: `rlshell.isolation`) or
    ``weak``, the opt-out for hosts that withhold namespaces (docs/security.md); at most
    ``tool_max_output_chars`` of its output is shown to the model. A call
    that fails (malformed, unknown tool, error, crash, time-out, memory) is an
    observation saying so, counted in ``tools/`` metrics, and scored
    ``tool_error_reward`` (added to the trajectory's reward, once per failed
    call; 0 by default).

    The markers also shape the SFT stage's conversations
    (`rlshell.conversation`): tool messages are wrapped in ``result_start`` …
    ``result_end``. The project's character tokenizer gets the four markers
    as tokens of their own in runs that use them (tools, or the SFT stage).
    """

    tools: tuple[str, ...] = ()
    max_turns: int = field(default=4, metadata=POSITIVE_INT)
    max_total_tokens: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    call_start: str = "<call>"
    call_end: str = "</call>"
    result_start: str = "<result>"
    result_end: str = "</result>"
    call_body: Literal["plain", "json"] = "plain"
    default_tool: str | None = None
    tool_timeout_s: float = field(default=5.0, metadata=POSITIVE)
    tool_memory_mb: int = field(default=512, metadata=POSITIVE_INT)
    tool_max_output_chars: int = field(default=1024, metadata=POSITIVE_INT)
    tool_network: bool = False
    tool_max_processes: int = field(default=32, metadata=POSITIVE_INT)
    tool_isolation: Literal["sandbox", "weak"] = "sandbox"
    num_tool_processes: int = field(default=1, metadata=POSITIVE_INT)
    tool_error_reward: float = 0.0


@frozen
class EnvConfig:
    """Environments for embodied runs (unused by reasoning runs).

    ``control_mode``: ManiSkill's controller (e.g. ``"pd_ee_delta_pose"``);
    null takes the task's default. ``obs_mode`` (ManiSkill, and MetaWorld without
    ``"rgbd"``): ``"state"`` (null), ``"rgb"`` or ``"rgbd"`` (camera images as
    ``main_images`` / ``wrist_images`` beside the robot's state); ``image_size``: the
    cameras' side in pixels (null: the task's own); ``ignore_terminations``: an
    episode runs until it is truncated even where the task ends it on
    success (ManiSkill's option of that name). ``uses_gpus``: the env workers
    take GPUs (ManiSkill: its batched GPU simulation; else one env per
    process on the CPU).

    When an env fails (its ``step`` raises, runs past ``step_timeout_s``, its
    process dies, or it returns a non-finite observation or reward):
    ``on_failure`` ``"stop"`` stops the run naming the env, the worker and the
    env step; ``"reset"`` rebuilds the env worker's envs and resets them,
    counts the failure (``env/failures``) and goes on: the episodes in
    progress end at the last observation before the failure as if truncated
    there (the failed step is not trained on), and the run stops once
    ``max_consecutive_failures`` env steps in a row have failed
    (`rlshell.envs.stepper.EnvStepper`). ``step_timeout_s`` (null: none)
    bounds each env ``step`` and ``reset`` call, with a timer that interrupts
    Python code and waits on env processes, not a simulator stuck inside C
    (``cluster.call_timeout_s`` stops the run then). ``isolate`` (the
    ``gymnasium`` env type): each env copy steps in a process of its own
    (spawned), so a copy that crashes (a segfault) takes only its process,
    which ``reset`` replaces; it costs a pipe round trip per step.
    ``memory_mb`` (with ``isolate``; null: no limit): how far each env copy's
    process's address space may grow past its size at the env's first reset
    (``RLIMIT_AS``), so a simulator whose memory runs away fails its step with
    a ``MemoryError`` (a failure as above) instead of taking the machine's
    memory.
    """

    env_type: str | None = None
    env_id: str | None = None
    num_envs: int = field(default=1, metadata=POSITIVE_INT)
    max_episode_steps: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    control_mode: str | None = None
    obs_mode: Literal["state", "rgb", "rgbd"] | None = None
    image_size: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    ignore_terminations: bool = False
    uses_gpus: bool = False
    cpus_per_worker: float = field(default=0.25, metadata=POSITIVE)
    on_failure: Literal["stop", "reset"] = "stop"
    step_timeout_s: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    max_consecutive_failures: int = field(default=3, metadata=POSITIVE_INT)
    isolate: bool = False
    memory_mb: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)


@frozen
class DataConfig:
    """Prompts: the generated arithmetic task, or JSONL/Parquet files with prompt/answer columns.

    ``task``: ``"arithmetic"`` generates sums (``operator`` ``"+"``) or products
    (``"*"``) of ``num_terms`` integers in ``[0, max_operand]``, holding out
    ``num_val`` prompts (and training on ``num_train`` of the rest, or all of
    them when null); ``"file"`` reads
    ``train_path`` and ``val_path`` (a ``.jsonl`` or ``.parquet`` file, or a
    folder or Hub dataset id ``org/name[/folder]`` whose train / validation or
    test files are read, `rlshell.hub`) with columns ``prompt_key`` and
    ``answer_key`` (a GSM8K answer keeps what follows ``####``);
    ``"conversations"`` (the sft runner's) reads demonstrations from
    ``train_path`` and ``val_path``, JSONL files of ``{"messages": [{"role":
    ..., "content": ...}, ...]}`` (`rlshell.conversation`); ``"demonstrations"`` (the
    sft runner's for an embodied policy) reads recorded episodes from ``train_path`` and
    ``val_path``, files of `rlshell.demonstrations`.

    ``phrasing`` (the arithmetic task): ``"equation"`` writes ``3+14=`` (for
    the character tokenizer of models built here); ``"question"`` asks
    ``What is 3 + 14?``; ``"word_problem"`` (three terms a, b, c: a·b + c)
    tells of boxes of things and some more beside them. ``chat_template``:
    each prompt is the user's turn of a conversation rendered by the model's
    own tokenizer's chat template, after ``system_prompt`` (a system turn;
    null: the template's default) and before the assistant's turn, which the
    model then writes and ends with its end-of-turn token. ``few_shot``: with
    ``chat_template``, turns rendered between the system turn and each
    prompt's user turn, as ``(role, text)`` pairs (roles ``user``,
    ``assistant``, ``tool``; from a user turn to an assistant turn): worked
    examples the model sees in its own template, no training (e.g. a
    calculator call, its ``tool`` result and the answer). ``instruction``
    follows every prompt after a space (``"Answer with the number only."``),
    as verl's data preparation appends one to GSM8K's questions.
    """

    task: Literal["arithmetic", "file", "conversations", "demonstrations"] = "arithmetic"
    train_path: str | None = None
    val_path: str | None = None
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    num_terms: int = field(default=3, metadata=POSITIVE_INT)
    max_operand: int = field(default=9, metadata=POSITIVE_INT)
    num_val: int = field(default=200, metadata=NON_NEGATIVE_INT)
    num_train: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    seed: int = 0
    operator: Literal["+", "*"] = "+"
    phrasing: Literal["equation", "question", "word_problem"] = "equation"
    chat_template: bool = False
    system_prompt: str | None = None
    few_shot: tuple[tuple[Literal["user", "assistant", "tool"], str], ...] = ()
    instruction: str | None = None


@frozen
class SACConfig:
    """Soft actor-critic (``algorithm.loss_type='sac'``, embodied runner), CleanRL's names.

    ``replay_size`` transitions are kept; each learner update draws
    ``batch_size`` of them. ``learning_starts`` transitions are collected with
    uniform random actions before the first update; after that the learner
    makes ``utd_ratio`` updates per transition collected (update-to-data
    ratio). The actor and α step every ``policy_frequency`` updates (that
    many times), the target Q heads move by Polyak ``tau`` every
    ``target_network_frequency`` updates. α starts at ``alpha`` and, with
    ``autotune``, is learned towards the entropy ``target_entropy`` (−dim A
    when null). The actor's learning rate is ``actor.optim.lr``; the critic's
    ``q_lr``, α's ``alpha_lr``. The discount is ``algorithm.gamma``.
    """

    replay_size: int = field(default=1_000_000, metadata=POSITIVE_INT)
    batch_size: int = field(default=256, metadata=POSITIVE_INT)
    learning_starts: int = field(default=5000, metadata=NON_NEGATIVE_INT)
    utd_ratio: float = field(default=1.0, metadata=POSITIVE)
    tau: float = field(default=0.005, metadata=UNIT_CLOSED)
    policy_frequency: int = field(default=2, metadata=POSITIVE_INT)
    target_network_frequency: int = field(default=1, metadata=POSITIVE_INT)
    autotune: bool = True
    alpha: float = field(default=0.2, metadata=POSITIVE)
    target_entropy: float | None = None
    q_lr: float = field(default=1e-3, metadata=POSITIVE)
    alpha_lr: float = field(default=1e-3, metadata=POSITIVE)


@frozen
class AlgorithmConfig:
    """Advantage estimator and policy loss (names from rlcore's registries) and their terms.

    PPO's update: ``ppo_epochs`` passes over each rollout batch; the
    embodied runner splits each pass into ``num_minibatches`` shuffled
    minibatches, the reasoning runner into mini-batches of
    ``actor.mini_batch_size`` prompts (verl's ``ppo_epochs`` and
    ``ppo_mini_batch_size``), one optimizer step each. The embodied runner's value loss is
    weighted by ``vf_coef`` (clipped around the old values by ``value_clip``
    when set), advantages standardised per minibatch when ``norm_adv``,
    rewards divided by the running std of the discounted return when
    ``norm_reward`` (`rlshell.rollout.trajectory.RewardScaler`), and the
    update stopped early once a minibatch's approximate KL from the rollout
    policy exceeds ``target_kl`` (null: every epoch runs).
    ``bootstrap_at_done`` (embodied PPO with ``gae`` and SAC): which ended
    episodes a value target bootstraps from V(final observation):
    ``truncated`` ones only (a termination is worth nothing after it), or
    ``always``, terminations too (ManiSkill's baselines: a task that
    terminates on success then does not teach the policy to avoid success
    for the dense reward it would collect before it).
    ``loss_type='sac'`` (embodied runner) trains with soft actor-critic
    instead, configured by ``sac``.

    The sampler–trainer mismatch (reasoning runner): ``old_logprobs`` is
    π_old of the policy ratio, ``recompute`` the actor's own log-probs of
    the batch before its update, ``rollout`` the log-probs the rollout
    engine reported. ``rollout_is`` corrects for sampling with the engine's
    numerics by per-token weights (`rlcore.mismatch.rollout_importance_weights`
    with ``rollout_is_threshold`` as its cap C, 1/C as its lower bound).

    DAPO's switches (reasoning runner; Yu et al. 2025): ``dynamic_sampling``
    drops the groups whose correctness scores (``reward.reward_type``) are all
    equal (`rlcore.shaping.filter_informative_groups`) and samples further
    prompts until ``runner.prompts_per_step`` informative groups are kept, at
    most ``max_sampling_rounds`` rounds a step (a batch still short after them
    is topped up with dropped groups, whose group-relative advantage is 0, and
    the metrics say how many); ``overlong_buffer`` L_cache adds the soft
    overlong penalty (`rlcore.shaping.overlong_penalty`, with L_max
    ``rollout.max_new_tokens``) times ``overlong_penalty_factor`` to each
    score; clip-higher is ``clip_high`` and token-level aggregation
    ``loss_agg_mode='token-mean'``.

    The KL term (reasoning runner; a reference policy runs when ``kl_coef`` > 0):
    by default a loss, ``kl_coef`` × ``kl_kind``'s estimate of KL(π ‖ π_ref)
    aggregated like the policy loss. With ``kl_in_reward`` it is a penalty in
    the reward instead (Ziegler et al. 2019; verl's ``use_kl_in_reward``): each
    response token's reward loses β·kₜ, kₜ the estimate of π_old (the policy
    that sampled the batch, per ``old_logprobs``) against the reference and β
    ``kl_coef`` (`rlcore.shaping.kl_penalized_rewards`), before the advantages
    are computed; the loss then has no KL term. ``kl_target`` turns β adaptive
    (`rlcore.shaping.adaptive_kl_coef`: β moves each step towards a mean
    response KL, summed over its tokens, of ``kl_target``, at a rate set by
    ``kl_horizon``; β is checkpointed).

    ``max_staleness`` (``runner.mode='async'``): a batch is sampled by
    weights at most that many updates older than those it trains (0: the
    synchronous runner's numbers exactly). Stale batches are off-policy: the
    ratio is taken against the rollout's log-probs with
    ``old_logprobs='rollout'``, and ``loss_type='decoupled_ppo'`` separates the
    behaviour policy (the rollout's) from the proximal one (recomputed), its
    weights capped by ``behavior_weight_cap``.

    ``baseline_form`` (``adv_type='reinforce_pp_baseline'``): what the group
    mean is subtracted from before whitening, the discounted reward-to-go
    (``reward_to_go``) or the row's undiscounted score (``score``, verl's form;
    it needs ``gamma`` 1), `rlcore.advantages.AdvantageConfig.baseline_form`.
    """

    adv_type: str = "grpo"
    loss_type: str = "ppo"
    group_size: int = field(default=8, metadata=POSITIVE_INT)
    clip_low: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    clip_high: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    dual_clip: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    loss_agg_mode: AggregationMode = "token-mean"
    old_logprobs: OldLogprobs = "recompute"
    rollout_is: RolloutISMode | None = None
    rollout_is_threshold: float = field(default=2.0, metadata=POSITIVE)
    behavior_weight_cap: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    dynamic_sampling: bool = False
    max_sampling_rounds: int = field(default=3, metadata=POSITIVE_INT)
    overlong_buffer: int | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    overlong_penalty_factor: float = field(default=1.0, metadata=NON_NEGATIVE)
    kl_coef: float = field(default=0.0, metadata=NON_NEGATIVE)
    kl_kind: KLKind = "k3"
    kl_in_reward: bool = False
    kl_target: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    kl_horizon: int = field(default=10_000, metadata=POSITIVE_INT)
    max_staleness: int = field(default=1, metadata=NON_NEGATIVE_INT)
    entropy_coef: float = field(default=0.0, metadata=NON_NEGATIVE)
    gamma: float = field(default=1.0, metadata=UNIT_CLOSED)
    lam: float = field(default=1.0, metadata=UNIT_CLOSED)
    baseline_form: BaselineForm = "reward_to_go"
    ppo_epochs: int = field(default=1, metadata=POSITIVE_INT)
    num_minibatches: int = field(default=1, metadata=POSITIVE_INT)
    vf_coef: float = field(default=0.5, metadata=NON_NEGATIVE)
    value_clip: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    norm_adv: bool = True
    norm_reward: bool = False
    target_kl: float | None = field(default=None, metadata=OPTIONAL_POSITIVE)
    bootstrap_at_done: Literal["truncated", "always"] = "truncated"
    sac: SACConfig = Factory(SACConfig)


@frozen
class RunnerConfig:
    """The loop: which runner, how long, how big a step, where outputs go.

    ``eval_interval``: evaluate on the held-out split every that many steps
    (and before the first); 0 turns evaluation off. ``rollout_steps``
    (embodied): env steps per env in each step's rollout. ``mode``
    (reasoning runner, its rollout in workers of its own): ``sync`` samples
    each step's batch with the weights of the step before; ``async`` keeps
    the rollout up to ``algorithm.max_staleness`` steps ahead of the update,
    generating while the actor trains (`rlshell.runners.async_rollout`).
    ``sft`` trains on demonstrations (``data.task='conversations'``): each
    step a supervised update on ``prompts_per_step`` conversations
    (`rlshell.runners.sft`).
    """

    runner_type: Literal["reasoning", "sft", "embodied", "probe"] = "reasoning"
    mode: Literal["sync", "async"] = "sync"
    experiment_name: str = "grpo"
    output_dir: str = "runs"
    max_steps: int = field(default=100, metadata=POSITIVE_INT)
    prompts_per_step: int = field(default=8, metadata=POSITIVE_INT)
    rollout_steps: int = field(default=32, metadata=POSITIVE_INT)
    eval_interval: int = field(default=0, metadata=NON_NEGATIVE_INT)
    seed: int = 0


@frozen
class LoggerConfig:
    """Metric backends and where they write (`rlshell.metrics`).

    ``wandb_project`` / ``swanlab_project``: the project of the ``wandb`` /
    ``swanlab`` backend's run (its name is ``runner.experiment_name``).
    """

    backends: tuple[Literal["console", "jsonl", "tensorboard", "wandb", "swanlab"], ...] = (
        "console",
        "jsonl",
        "tensorboard",
    )
    log_every: int = field(default=1, metadata=POSITIVE_INT)
    wandb_project: str | None = None
    swanlab_project: str | None = None


@frozen
class CheckpointConfig:
    """Sharded checkpoints under ``<run dir>/checkpoints/global_step_N``.

    ``interval``: save every that many steps and at the last step; 0 never
    saves. ``keep_last``: how many checkpoints to keep (null keeps all).
    ``export_hf``: export the last checkpoint's policy at the end of the run
    (`rlshell.export`): a Hugging Face model to ``<run dir>/hf_model``, any
    other policy to ``<run dir>/policy``.

    ``resume``: null starts fresh; ``"auto"`` continues from the newest
    checkpoint of the run directory if there is one; a path resumes from that
    checkpoint directory, which must exist.

    ``save_on_interrupt``: the first Ctrl-C lets the step under way finish
    and saves a checkpoint of it before the run stops (a run with
    ``interval`` 0 saves none); false stops after the step without one.
    """

    interval: int = field(default=0, metadata=NON_NEGATIVE_INT)
    keep_last: int | None = field(default=2, metadata=OPTIONAL_POSITIVE)
    resume: str | None = None
    export_hf: bool = True
    save_on_interrupt: bool = True


@frozen
class Config:
    """A whole run."""

    cluster: ClusterConfig = Factory(ClusterConfig)
    actor: ActorConfig = Factory(ActorConfig)
    critic: CriticConfig = Factory(CriticConfig)
    rollout: RolloutConfig = Factory(RolloutConfig)
    reward: RewardConfig = Factory(RewardConfig)
    agent: AgentConfig = Factory(AgentConfig)
    env: EnvConfig = Factory(EnvConfig)
    data: DataConfig = Factory(DataConfig)
    algorithm: AlgorithmConfig = Factory(AlgorithmConfig)
    runner: RunnerConfig = Factory(RunnerConfig)
    logger: LoggerConfig = Factory(LoggerConfig)
    checkpoint: CheckpointConfig = Factory(CheckpointConfig)


def field_problems(value: Any, path: str = "") -> Iterator[str]:
    """Walk the config; yield '{key}: expected ..., got ...' for each violated field constraint."""
    if attrs.has(type(value)):
        for item in attrs.fields(type(value)):
            child = getattr(value, item.name)
            key = f"{path}.{item.name}" if path else item.name
            check = item.metadata.get(CHECK_KEY)
            if check is not None:
                predicate, expected = check
                if not _holds(predicate, child):
                    yield f"{key}: expected {expected}, got {child!r}"
            yield from field_problems(child, key)
    elif isinstance(value, dict):
        for name, child in value.items():
            yield from field_problems(child, f"{path}.{name}")


def _holds(predicate: Any, value: Any) -> bool:
    try:
        return bool(predicate(value))
    except TypeError:
        return False
