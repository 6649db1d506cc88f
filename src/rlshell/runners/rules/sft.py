"""What the sft trainers accept: their own rules and the keys they leave unread.

`SFTRules` is `rlshell.runners.sft.SFTTrainer`'s half that validation reads
(`rlshell.runners.rules`): it imports neither the actor nor the tokenizer.
`EmbodiedSFTRules` is `rlshell.runners.embodied_sft.EmbodiedSFTTrainer`'s (an sft
run of an embodied policy, on recorded demonstrations).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs

from rlshell.cluster.placement import PlacementPlan
from rlshell.config import AgentConfig, AlgorithmConfig, Config, DataConfig
from rlshell.engines.training import data_parallel_shares as backend_shares
from rlshell.engines.training import pipeline_stages
from rlshell.runners.facts import RunFacts
from rlshell.runners.unread import (
    chat_markers_unread,
    chat_template_problems,
    compile_unread,
    sac_unread,
    stages_unread,
)

__all__ = ["EmbodiedSFTRules", "SFTRules", "data_parallel_shares"]

# What the sft run reads of the agent's settings: the markers of the conversations' text.
AGENT_KEYS_READ = ("call_start", "call_end", "result_start", "result_end")
# ...and of the data's: where the conversations are.
DATA_KEYS_READ = ("task", "train_path", "val_path", "chat_template")
ALGORITHM_KEYS_READ = ("loss_agg_mode",)


class SFTRules:
    """What an sft run may ask for (`rlshell.runners.rules.TrainerRules`)."""

    trainer_name: ClassVar[str] = "SFTTrainer"
    registered_names: ClassVar[tuple[str, ...]] = ("actor.model.model_type",)

    @classmethod
    def problems(cls, facts: RunFacts, plan: PlacementPlan | None) -> list[str]:
        config = facts.config
        data = config.data
        problems = []
        if data.task != "conversations":
            problems.append(
                f"data.task: the sft runner trains on demonstrations, JSONL conversations "
                f"(data.task='conversations' with data.train_path); got '{data.task}'"
            )
        elif data.train_path is None:
            problems.append(
                "data.train_path: the sft runner needs its training conversations (a JSONL file "
                'of {"messages": [...]} lines)'
            )
        problems += _held_out_and_alone(facts, "conversations", data.task == "conversations")
        problems += chat_template_problems(config)
        if pipeline_stages(config.actor) > 1:
            problems.append(
                "actor.megatron.pipeline_model_parallel_size: the sft update and evaluation run "
                "the whole model on each rank of a tensor-parallel group (Megatron's pipeline "
                "schedule is not built for them); use 1, with tensor or data parallelism"
            )
        return problems + _shares_problems(config, plan, "conversations")

    @classmethod
    def unread(cls, facts: RunFacts) -> dict[str, str]:
        config = facts.config
        who = "the sft runner"
        demonstrations = f"{who} trains on demonstrations (data.task='conversations')"
        unread = {
            **compile_unread(f"{who} does not read it"),
            **stages_unread(config, who),
            **sac_unread(who),
            "rollout": f"{demonstrations}: it generates nothing",
            "reward": f"{demonstrations}: nothing is scored",
            "critic": f"{demonstrations}: there is no value model",
            "env": f"{demonstrations}; env.* configures the embodied runner's environments",
            "runner.mode": f"runs the reasoning rollout ahead of its update; {who} has no rollout",
            "runner.rollout_steps": "env steps per env in an embodied step; an sft step is "
            "runner.prompts_per_step conversations",
            "actor.mini_batch_size": f"splits the reasoning update into mini-batches of prompts; "
            f"{who} makes one optimizer step on each step's runner.prompts_per_step "
            "conversations",
            "actor.share_prompt_forward": f"shares a prompt's forward among a GRPO group's "
            f"samples; {who}'s rows are distinct conversations",
            "actor.enable_offload": f"moves the actor out of the way of a rollout on the GPUs "
            f"it shares; {who} has no rollout",
            "actor.reference_cpus_per_worker": f"sizes the reasoning runner's reference "
            f"workers (the KL term); {who} runs none",
        }
        for key in _fields(AlgorithmConfig, (*ALGORITHM_KEYS_READ, "sac")):
            unread[f"algorithm.{key}"] = (
                f"{who}'s loss is rlcore's sft_loss (the negative log-likelihood of the "
                "trained tokens), aggregated with algorithm.loss_agg_mode; no other algorithm "
                "key shapes it"
            )
        for key in _fields(AgentConfig, AGENT_KEYS_READ):
            unread[f"agent.{key}"] = (
                f"configures the reasoning runner's tool calls; {who} reads the markers of "
                "the conversations' text only (agent.call_start, call_end, result_start, "
                "result_end)"
            )
        for key in _fields(DataConfig, DATA_KEYS_READ):
            unread[f"data.{key}"] = (
                f"describes prompts (the arithmetic task or prompt files); {demonstrations}, "
                "read from data.train_path and data.val_path"
            )
        unread.update(chat_markers_unread(config))
        return unread


EMBODIED_DATA_KEYS_READ = ("task", "train_path", "val_path")


class EmbodiedSFTRules:
    """What an sft run of an embodied policy may ask for (`rlshell.runners.rules.TrainerRules`)."""

    trainer_name: ClassVar[str] = "EmbodiedSFTTrainer"
    registered_names: ClassVar[tuple[str, ...]] = ("actor.model.model_type",)

    @classmethod
    def problems(cls, facts: RunFacts, plan: PlacementPlan | None) -> list[str]:
        config = facts.config
        data = config.data
        problems = []
        if data.task != "demonstrations":
            problems.append(
                f"data.task: an sft run of an embodied policy (actor.model.category="
                f"'embodied') trains on recorded episodes, data.task='demonstrations' with "
                f"data.train_path (python -m rlshell.record); got '{data.task}'"
            )
        elif data.train_path is None:
            problems.append(
                "data.train_path: the embodied sft run needs its demonstrations (a file "
                "python -m rlshell.record writes)"
            )
        problems += _held_out_and_alone(facts, "demonstrations", True)
        return problems + _shares_problems(config, plan, "demonstration steps")

    @classmethod
    def unread(cls, facts: RunFacts) -> dict[str, str]:
        config = facts.config
        who = "the embodied sft run"
        recorded = f"{who} trains on recorded episodes (data.task='demonstrations')"
        unread = {
            **compile_unread(f"{who} does not read it"),
            **stages_unread(config, who),
            **sac_unread(who),
            "rollout": f"{recorded}: it acts in no env",
            "reward": f"{recorded}: nothing is scored",
            "critic": f"{recorded}: there is no value model",
            "env": f"{recorded}; env.* configures the embodied RL runners' envs (and "
            "python -m rlshell.record's)",
            "agent": f"configures the reasoning runner's tool calls; {who} has none",
            "runner.mode": f"runs the reasoning rollout ahead of its update; {who} has no rollout",
            "runner.rollout_steps": "env steps per env in an embodied step; an sft step is "
            "runner.prompts_per_step demonstration steps",
            "actor.mini_batch_size": f"splits the reasoning update into mini-batches; {who} "
            "makes one optimizer step on each step's runner.prompts_per_step rows",
            "actor.micro_batch_max_tokens": f"budgets the reasoning actor's token micro-batches; "
            f"{who}'s rows are observations",
            "actor.logprob_chunk_size": f"chunks the reasoning actor's vocabulary log-probs; "
            f"{who} reads the policy's sft_forward loss",
            "actor.share_prompt_forward": f"shares a prompt's forward among a GRPO group's "
            f"samples; {who} has no prompts",
            "actor.pack_sequences": f"packs the reasoning actor's token sequences; {who} has none",
            "actor.enable_offload": f"moves the actor out of the way of a rollout on the GPUs "
            f"it shares; {who} has no rollout",
            "actor.reference_cpus_per_worker": f"sizes the reasoning runner's reference "
            f"workers (the KL term); {who} runs none",
        }
        for key in _fields(AlgorithmConfig, ("sac",)):
            unread[f"algorithm.{key}"] = (
                f"{who}'s loss is the policy's own sft_forward (flow_policy: flow matching; "
                "tiny_vla: the action tokens' negative log-likelihood); no algorithm key "
                "shapes it"
            )
        for key in _fields(DataConfig, EMBODIED_DATA_KEYS_READ):
            unread[f"data.{key}"] = (
                f"describes prompts or conversations; {recorded}, read from data.train_path "
                "and data.val_path"
            )
        return unread


def _held_out_and_alone(facts: RunFacts, rows: str, reads_rows: bool) -> list[str]:
    """An sft run's held-out ``rows`` when it evaluates (and ``reads_rows``: its data.task is
    the one it reads), and its actor placed alone."""
    runner, problems = facts.config.runner, []
    if reads_rows and runner.eval_interval and facts.config.data.val_path is None:
        problems.append(
            f"runner.eval_interval: evaluating every {runner.eval_interval} steps reads the "
            f"held-out {rows} of data.val_path, which is unset; set it, or runner.eval_interval=0"
        )
    others = sorted(name for name in facts.layout.keys if name != "actor")
    if others:
        problems.append(
            f"cluster.component_placement: the sft run starts the actor alone; it places "
            f"{', '.join(others)} too (e.g. {{'actor': '0:0-1'}})"
        )
    return problems


def _shares_problems(config: Config, plan: PlacementPlan | None, rows: str) -> list[str]:
    """Every data-parallel rank of the actor needs a share of a step's ``rows``."""
    if plan is None or not any(c.name == "actor" for c in plan.components):
        return []
    shares = data_parallel_shares(config, len(plan.component("actor").workers))
    steps = config.runner.prompts_per_step
    if steps >= shares:
        return []
    return [
        f"runner.prompts_per_step: {steps} {rows} a step, fewer than the actor's {shares} "
        "data-parallel ranks; every rank needs a share"
    ]


def data_parallel_shares(config: Config, ranks: int) -> int:
    """How many shares the actor's ``ranks`` split a batch's rows into: one per FSDP rank, one
    per Megatron model replica (the backend's entry says)."""
    return backend_shares(config.actor, ranks)


def _fields(cls: type, read: Sequence[str]) -> list[str]:
    """The fields of the attrs class ``cls`` other than ``read``."""
    return [field.name for field in attrs.fields(cls) if field.name not in read]
