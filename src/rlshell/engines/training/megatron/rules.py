"""What the megatron backend refuses before start, and how its ranks split a batch.

Imports no Megatron at module level (validation reads these in the driver).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlshell.config import ActorConfig, Config

if TYPE_CHECKING:
    from rlshell.cluster.placement import PlacementPlan

__all__ = [
    "MEGATRON_INSTALL",
    "MEGATRON_NOT_BUILT",
    "megatron_data_parallel_shares",
    "megatron_pipeline_stages",
    "megatron_problems",
]

MEGATRON_INSTALL = "run `make install` (or `pip install -e '.[megatron]'`)"

# Megatron features this backend does not build, each refused when set, with why.
MEGATRON_NOT_BUILT = {
    "context_parallel_size": "context parallelism (each sequence split over ranks) is not built "
    "in this backend",
    "expert_model_parallel_size": "expert parallelism is for mixture-of-experts layers; the "
    "backend maps dense Qwen2 and Llama models",
    "sequence_parallel": "sequence parallelism is not built in this backend (Megatron's runs on "
    "Transformer Engine's norms; with torch's it fails on CPU)",
    "use_distributed_optimizer": "Megatron's distributed optimizer is not built in this backend "
    "(it needs CUDA); each rank keeps AdamW state for its own shards",
}


def megatron_data_parallel_shares(config: ActorConfig, ranks: int) -> int:
    """One share per model replica: tensor × pipeline ranks hold one."""
    megatron = config.megatron
    return ranks // (megatron.tensor_model_parallel_size * megatron.pipeline_model_parallel_size)


def megatron_pipeline_stages(config: ActorConfig) -> int:
    return config.megatron.pipeline_model_parallel_size


def megatron_problems(config: Config, plan: PlacementPlan | None) -> list[str]:
    """What it cannot train, and a grid that does not fit the plan's actor ranks."""
    actor = config.actor
    runner = config.runner.runner_type
    if runner not in ("reasoning", "sft", "probe"):
        return [
            f"actor.backend: megatron trains the reasoning and sft runners' causal LMs; the "
            f"'{runner}' runner trains with actor.backend=fsdp"
        ]
    megatron = actor.megatron
    defaults = type(megatron)()
    problems = [
        f"actor.megatron.{key}: {reason}"
        for key, reason in MEGATRON_NOT_BUILT.items()
        if getattr(megatron, key) != getattr(defaults, key)
    ]
    if actor.share_prompt_forward and runner != "sft":  # (the sft runner does not read it)
        problems.append(
            "actor.share_prompt_forward: the shared prompt forward runs Hugging Face's KV cache, "
            "which Megatron's model has not; set actor.share_prompt_forward=false"
        )
    if actor.pack_sequences:
        problems.append(
            "actor.pack_sequences: the packed forward relies on Hugging Face's packed-sequence "
            "masks; the Megatron backend's pipeline takes padded rows; set "
            "actor.pack_sequences=false"
        )
    model = actor.model
    unsupported = {
        "model_type": (model.model_type != "hf_causal_lm", "maps hf_causal_lm models only"),
        "is_lora": (model.is_lora, "trains every weight; LoRA adapters are not built for it"),
        "gradient_checkpointing": (
            model.gradient_checkpointing,
            "does not map it to Megatron's activation recomputation in this version",
        ),
        "precision": (model.precision != "fp32", "trains fp32 weights in this version"),
    }
    problems += [
        f"actor.model.{key}: the Megatron backend {reason}"
        for key, (refused, reason) in unsupported.items()
        if refused
    ]
    tp, pp = megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size
    if not unsupported["model_type"][0]:
        from rlshell.engines.training.megatron.layout import GPTLayout
        from rlshell.engines.training.megatron.model import unmapped_features
        from rlshell.models.hf_causal_lm import hf_model_config

        try:
            hf_config = hf_model_config(model)
            GPTLayout.of(hf_config, tp=tp, pp=pp)
        except ValueError as error:
            problems.append(f"actor.megatron: {error}")
        except OSError:
            pass  # a model that cannot be read is actor.model.path's own problem
        else:
            problems += [
                f"actor.model: the Megatron backend cannot train this model: {feature}"
                for feature in unmapped_features(hf_config)
            ]
    if plan is not None and any(c.name == "actor" for c in plan.components):
        ranks = plan.component("actor").world_size
        if ranks % (tp * pp):
            problems.append(
                f"actor.megatron: tensor parallel {tp} × pipeline parallel {pp} = {tp * pp} "
                f"ranks per model replica, but the plan gives the actor {ranks} ranks "
                "(cluster.component_placement): use a multiple of it"
            )
    return problems
