"""Offload between phases: decided once from config and plan (`rlshell.runners.offload`),
acted on by the reasoning trainer, refused where it would make room for nothing.

The decisions are checked on simulated plans (``cluster.simulate``), the
trainer's choreography with stand-in worker groups; the GPU memory itself is
tests/shell/test_offload_gpu.py's.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import torch

from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import ConfigError
from rlshell.data import ArithmeticTask, arithmetic_task
from rlshell.runners.facts import RunFacts
from rlshell.runners.offload import OffloadPlan, offload_problems, plan_offload
from rlshell.runners.reasoning import ReasoningTrainer
from rlshell.runners.reasoning.turns import GpuTurns
from rlshell.runners.spec import resolve_spec
from rlshell.runners.validation import cluster_spec_for, load_config, plan_for, validate

GRPO = "configs/grpo.py"


def planned(*overrides: str, source: str = GRPO) -> tuple[Any, Any]:
    config = load_config(source, list(overrides), for_run=False)
    spec = cluster_spec_for(config)
    assert spec is not None
    return RunFacts.of(config), plan_for(config, spec)


def refusals(*overrides: str, source: str = GRPO) -> list[str]:
    try:
        load_config(source, list(overrides), for_run=False)
    except ConfigError as error:
        return error.problems
    return []


SHARING = 'cluster.component_placement={"actor": "0-3", "rollout": "0-3", "reward": "0"}'
APART = 'cluster.component_placement={"actor": "0-3", "rollout": "4-7", "reward": "0"}'


def test_by_default_the_actor_offloads_where_the_rollout_in_its_processes_shares_its_gpus() -> None:
    assert plan_offload(*planned("cluster.simulate=1x8")) == OffloadPlan(
        actor_optimizer=True, actor_params=True, rollout=False
    )


def test_a_shared_weight_engine_keeps_the_actors_parameters_on_the_gpu() -> None:
    facts, plan = planned("cluster.simulate=1x8", "rollout.weight_sync=shared")
    assert plan_offload(facts, plan) == OffloadPlan(actor_optimizer=True, actor_params=False)


def test_a_rollout_of_its_own_on_the_actors_gpus_offloads_too() -> None:
    assert plan_offload(*planned("cluster.simulate=1x8", SHARING)) == OffloadPlan(
        actor_optimizer=True, actor_params=True, rollout=True
    )


@pytest.mark.parametrize(
    "overrides",
    [["cluster.simulate=1x8", APART], ["cluster.simulate=1x0x2"]],
    ids=["apart", "cpu"],
)
def test_nothing_offloads_where_nothing_is_shared(overrides: list[str]) -> None:
    assert plan_offload(*planned(*overrides)) == OffloadPlan()


def test_false_keeps_the_planners_refusal_of_shared_gpus() -> None:
    problems = refusals("cluster.simulate=1x8", SHARING, "rollout.enable_offload=false")
    assert problems == [
        "cluster.component_placement: actor, rollout: both use GPUs 0-3 on node 0, but "
        "rollout.enable_offload is false (collocated components offload between phases); give "
        "them disjoint GPUs or allow sharing"
    ]


def test_true_is_refused_where_it_would_make_room_for_nothing() -> None:
    assert refusals("cluster.simulate=1x0x2", "actor.enable_offload=true") == [
        "actor.enable_offload: the plan gives the actor no GPU; on CPU the weights already "
        "live in host memory. Leave it null (offload where a GPU is shared)"
    ]
    assert refusals("cluster.simulate=1x8", APART, "rollout.enable_offload=true") == [
        "rollout.enable_offload: the rollout's GPUs are not shared with the actor, so "
        "offloading makes room for nothing. Leave it null (offload where a GPU is shared)"
    ]
    (problem,) = refusals("cluster.simulate=1x8", "rollout.enable_offload=true")
    assert problem.startswith("rollout.enable_offload: the rollout runs in the actor's processes")
    assert refusals("cluster.simulate=1x8", SHARING, "actor.enable_offload=true") == []
    facts, plan = planned("cluster.simulate=1x8", SHARING, "rollout.enable_offload=true")
    assert offload_problems(facts, plan) == []


@pytest.mark.parametrize("key", ["actor.enable_offload", "rollout.enable_offload"])
@pytest.mark.parametrize(
    ("source", "placement"),
    [
        ("configs/ppo_cartpole.py", None),
        ("configs/ppo_cartpole.py", '{"actor": "0:0", "rollout": "0:0", "env": "0:0"}'),
        ("configs/sac_pendulum.py", None),
    ],
    ids=["collocated-ppo", "pipelined-ppo", "sac"],
)
def test_embodied_trainers_refuse_to_be_asked_to_offload(
    key: str, source: str, placement: str | None
) -> None:
    overrides = [f"{key}=true"]
    if placement is not None:
        overrides.append(f"cluster.component_placement={placement}")
    (problem,) = refusals(*overrides, source=source)
    assert problem.startswith(f"{key}: ")
    assert "does not offload between phases" in problem


def test_null_is_the_default_and_validates_everywhere() -> None:
    for overrides in (["cluster.simulate=1x8"], ["cluster.simulate=1x8", SHARING], []):
        config = load_config(GRPO, list(overrides), for_run=False)
        assert config.actor.enable_offload is None
        assert config.rollout.enable_offload is None
        assert validate(config, for_run=False) == []


# --- the trainer's choreography ---------------------------------------------------------------


class _Done:
    def wait(self) -> list[float]:
        return [0.0]


class _Group:
    """A stand-in worker group that records the offload calls made on it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def offload(self, *args: Any) -> _Done:
        self.log.append(f"{self.name}.offload{args}")
        return _Done()

    def reload(self, *args: Any) -> _Done:
        self.log.append(f"{self.name}.reload{args}")
        return _Done()


def _turns(offload: OffloadPlan, log: list[str]) -> GpuTurns:
    return GpuTurns(offload, _Group("actor", log), _Group("rollout", log))  # type: ignore[arg-type]


def test_the_actor_and_rollout_take_turns_and_each_move_happens_once_per_phase() -> None:
    log: list[str] = []
    turns = _turns(OffloadPlan(actor_optimizer=True, actor_params=True, rollout=True), log)
    turns.rollout()  # first rollout: everything starts on the GPU
    turns.rollout()  # evaluation right after: nothing to move
    turns.update()
    turns.update()  # a save after the update: nothing to move
    turns.rollout()
    assert log == [
        "actor.offload(True,)",
        "rollout.offload()",
        "actor.reload(True,)",
        "actor.offload(True,)",
        "rollout.reload()",
    ]


def test_a_plan_that_offloads_nothing_makes_no_calls() -> None:
    log: list[str] = []
    turns = _turns(OffloadPlan(), log)
    turns.rollout()
    turns.update()
    assert log == []


def test_the_hf_engine_offloads_its_weights_in_place() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlshell.engines.rollout.hf import HFRolloutEngine
    from rlshell.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )
    engine = HFRolloutEngine(model, tokenizer, torch.device("cpu"))
    targets = engine.weight_targets()
    engine.offload()
    engine.reload()
    after = engine.weight_targets()
    assert all(after[name] is tensor for name, tensor in targets.items())


@pytest.mark.slow
def test_offloading_workers_train_as_workers_that_never_moved(
    ray_cluster: Cluster, tmp_path: Path
) -> None:
    """The worker methods end to end over Ray (on CPU each move is a no-op copy): a step with
    every offload on gives the weights of a step without, and reports ``time/offload``."""
    overrides = [
        "runner.prompts_per_step=2",
        "algorithm.group_size=2",
        "rollout.max_new_tokens=4",
        "algorithm.entropy_coef=0.01",  # a gradient whatever the rewards
        'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "reward": "0"}',
        "actor.fsdp_config.wrap_policy.min_num_params=0",
    ]
    config = load_config(GRPO, overrides)
    plan = plan_for(config, ray_cluster.spec())
    spec = resolve_spec(config)
    prompts = arithmetic_task("train", ArithmeticTask.of(config.data))[:2]
    weights = []
    for offload in (
        OffloadPlan(),
        OffloadPlan(actor_optimizer=True, actor_params=True, rollout=True),
    ):
        with closing(ReasoningTrainer.launch(spec, ray_cluster, plan, tmp_path)) as trainer:
            trainer.running.turns.offload = offload  # the same plan, whichever moves
            for step in (1, 2):
                metrics = trainer.train_on(step, prompts)
            assert ("time/offload" in metrics) == offload.any
            weights.append(trainer.groups.actor.full_weights().wait()[0])
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name
