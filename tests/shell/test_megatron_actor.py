"""One GRPO update with the Megatron backend equals the FSDP backend's (issue 18's equivalence).

Two processes over gloo, as the actor worker group runs them: from the same
config, seed and batch (configs/grpo.py's model and a batch its HF engine
sampled), `ActorWorker.run_training` makes one optimizer step with FSDP on two
ranks, and with Megatron at TP=1 (two data-parallel replicas), TP=2 and PP=2
(two stages, Megatron's 1F1B schedule over the update's micro-batches). The
losses and the updated weights (gathered back to Hugging Face names) agree
to 1e-5; then a Megatron checkpoint saved after the step is loaded into a
fresh worker and gives the same weights bit for bit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the megatron extra)")

from rlshell.config import Config
from rlshell.runners.validation import load_config
from rlshell.tokenizer import prepare_tokenizer, with_tokenizer_ids
from tests.shell.test_run import free_port

# One xdist worker runs the module, so the two-process spawn behind `results` happens once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("megatron_actor")]

BASE = [
    # Two layers, as configs/grpo_megatron.py: a pipeline of 2 stages splits them evenly.
    "actor.model.model_kwargs.num_hidden_layers=2",
    "actor.share_prompt_forward=false",  # Megatron's forward has no KV-cache prefix path
    "actor.micro_batch_max_tokens=64",  # several micro-batches: the pipeline schedules them
]
# configs/grpo.py's FSDP wrap policy, back to its default for Megatron (which does not read it).
MEGATRON = ["actor.backend=megatron", "actor.fsdp_config.wrap_policy.min_num_params=0"]
BACKENDS: dict[str, list[str]] = {
    "fsdp": [],
    "megatron_tp1_dp2": MEGATRON,
    "megatron_tp2": [*MEGATRON, "actor.megatron.tensor_model_parallel_size=2"],
    "megatron_pp2": [*MEGATRON, "actor.megatron.pipeline_model_parallel_size=2"],
}
ATOL = 1e-5


def _config(tokenizer_dir: str, overrides: list[str]) -> Config:
    config = load_config(Path("configs/grpo.py"), [*BASE, *overrides])
    return with_tokenizer_ids(config, tokenizer_dir)


def _batch(config: Config, tokenizer_dir: str) -> tuple[Any, torch.Tensor]:
    """A batch configs/grpo.py's HF engine samples from the seeded model, and its scores."""
    from rlshell.engines.rollout.hf import HFRolloutEngine
    from rlshell.models import get_model
    from rlshell.rollout import SamplingParams
    from rlshell.tokenizer import load_tokenizer

    torch.manual_seed(config.actor.seed)
    engine = HFRolloutEngine(
        get_model(config.actor.model), load_tokenizer(tokenizer_dir), torch.device("cpu")
    )
    prompts = ["1+2+3=", "4+4=", "9+9+9=", "7+0+1="]
    batch = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=4), seed=5)
    scores = torch.linspace(0.0, 1.0, batch.rows).roll(3)  # unequal within every group
    return batch, scores


def _worker(rank: int, port: int, work: str) -> None:
    from rlshell.rollout.advantages import compute_advantages
    from rlshell.workers.actor import ActorWorker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    tokenizer_dir = str(Path(work) / "tokenizer")
    batch, scores = torch.load(Path(work) / "batch.pt", weights_only=False)
    results: dict[str, Any] = {}
    for name, overrides in BACKENDS.items():
        worker = ActorWorker(
            _config(tokenizer_dir, overrides), total_steps=10, rollout_in_actor=False
        )
        worker.rank, worker.world_size = rank, 2
        worker.init_worker(tokenizer_dir)
        before = worker.full_weights()
        metrics = worker.run_training(
            batch, compute_advantages(batch, scores, worker.config).advantages
        )
        after = worker.full_weights()
        results[name] = {"metrics": metrics, "before": before, "after": after}
        if name == "megatron_tp2":
            worker.save_checkpoint(str(Path(work) / "ckpt"), step=1)
            fresh = ActorWorker(
                _config(tokenizer_dir, overrides), total_steps=10, rollout_in_actor=False
            )
            fresh.rank, fresh.world_size = rank, 2
            fresh.init_worker(tokenizer_dir)
            results["resumed_step"] = fresh.load_checkpoint(str(Path(work) / "ckpt"))
            results["resumed"] = fresh.full_weights()
            # The optimizer state came back too: a second step from both is the same step.
            worker.run_training(batch, compute_advantages(batch, scores, worker.config).advantages)
            fresh.run_training(batch, compute_advantages(batch, scores, fresh.config).advantages)
            results["second_step"] = (worker.full_weights(), fresh.full_weights())
        if name == "megatron_pp2":  # another grid than the checkpoint's: refused, named
            results["other_grid"] = _error_of(worker.load_checkpoint, str(Path(work) / "ckpt"))
        if name == "fsdp":
            worker.save_checkpoint(str(Path(work) / "fsdp_ckpt"), step=1)
            fsdp_worker = worker
    # Each backend refuses the other's checkpoint, saying what it found.
    results["fsdp_reads_megatron"] = _error_of(
        fsdp_worker.load_checkpoint, str(Path(work) / "ckpt")
    )
    results["megatron_reads_fsdp"] = _error_of(
        worker.load_checkpoint, str(Path(work) / "fsdp_ckpt")
    )
    torch.save(results, Path(work) / f"rank{rank}.pt")


def _error_of(load: Any, path: str) -> str:
    try:
        load(path)
    except (ValueError, FileNotFoundError) as error:
        return f"{type(error).__name__}: {error}"
    return "loaded"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    work = tmp_path_factory.mktemp("megatron_actor")
    config = load_config(Path("configs/grpo.py"), BASE)
    tokenizer_dir = prepare_tokenizer(config, work)  # the project's, built in work/tokenizer
    config = with_tokenizer_ids(config, tokenizer_dir)
    torch.save(_batch(config, tokenizer_dir), work / "batch.pt")
    mp.spawn(_worker, args=(free_port(), str(work)), nprocs=2, join=True)
    return [torch.load(work / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("name", [n for n in BACKENDS if n != "fsdp"])
def test_one_grpo_step_equals_fsdps(results: list[dict[str, Any]], name: str) -> None:
    fsdp, megatron = results[0]["fsdp"], results[0][name]
    for key in ("before", "after"):
        assert megatron[key].keys() == fsdp[key].keys()
    for weight, tensor in fsdp["before"].items():
        assert torch.equal(megatron["before"][weight], tensor), weight  # the same start
    moved = 0
    for weight, tensor in fsdp["after"].items():
        assert torch.allclose(megatron["after"][weight], tensor, atol=ATOL, rtol=0), weight
        moved += int(not torch.equal(tensor, fsdp["before"][weight]))
    assert moved > len(fsdp["after"]) // 2  # the step changed most tensors
    for key in ("train/pg_loss", "train/loss", "train/grad_norm"):
        assert megatron["metrics"][key] == pytest.approx(fsdp["metrics"][key], abs=ATOL), key
    # The entropy metric is a mean of micro-batch means: with one data-parallel share (TP=2,
    # PP=2) the rows fall into other micro-batches than on FSDP's two ranks.
    assert megatron["metrics"]["train/entropy"] == pytest.approx(
        fsdp["metrics"]["train/entropy"], rel=1e-4
    )
    # Every rank reports the same step (metrics are reduced over the data-parallel shares).
    assert results[1][name]["metrics"]["train/loss"] == pytest.approx(
        megatron["metrics"]["train/loss"], abs=1e-12
    )


def test_a_megatron_checkpoint_resumes_bit_for_bit(results: list[dict[str, Any]]) -> None:
    for rank in results:
        assert rank["resumed_step"] == 1
        for weight, tensor in rank["megatron_tp2"]["after"].items():
            assert torch.equal(rank["resumed"][weight], tensor), weight
        continued, resumed = rank["second_step"]
        for weight, tensor in continued.items():
            assert torch.equal(resumed[weight], tensor), weight


def test_a_checkpoint_of_another_grid_or_backend_is_refused_by_name(
    results: list[dict[str, Any]],
) -> None:
    rank0 = results[0]
    assert rank0["other_grid"].startswith("ValueError: checkpoint ")
    assert "was saved by a Megatron grid" in rank0["other_grid"]
    assert "resume with the same actor placement and actor.megatron sizes" in rank0["other_grid"]
    assert rank0["fsdp_reads_megatron"].startswith("FileNotFoundError: checkpoint ")
    assert "no extra_state_rank0.pt" in rank0["fsdp_reads_megatron"]
    assert rank0["megatron_reads_fsdp"].startswith("FileNotFoundError: checkpoint ")
    assert "no megatron_rank0.pt: not a Megatron actor checkpoint" in rank0["megatron_reads_fsdp"]
