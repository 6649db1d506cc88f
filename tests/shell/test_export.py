"""`rlshell.export`: every runner's checkpoints exported, then loaded back without them.

Checkpoints are written here as the runners write them: the actor's shards
with `FSDPModelManager.save_checkpoint` on a gloo group of this one process,
SAC's learner state with `SACLearner.state_dict`, and the run's
``config.json`` as ``python -m rlshell.train`` writes it (before the
reasoning runner fills in the tokenizer's ids). Their weights are moved off
the values the model is built with, so a policy whose weights were not
loaded acts differently. The extension's model is exported in child
processes: the extension never enters this one (test_extensions.py checks
that a driver which does not load it has not imported it).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from attrs import evolve
from torch import nn

from rlshell.checkpoint import (
    TrainerState,
    checkpoint_dir,
    commit,
    run_config_path,
    staging_dir,
    write_manifest,
    write_trainer_state,
)
from rlshell.config import (
    CONVERTER,
    Config,
    EnvConfig,
    ModelConfig,
    read_config_source,
    write_config,
)
from rlshell.engines.training.fsdp import FSDPModelManager
from rlshell.export import (
    MODEL_CONFIG_FILE,
    POLICY_EXPORT_DIR,
    WEIGHTS_FILE,
    ExportError,
    export_checkpoint,
    export_final_policy,
    load_exported,
    load_policy,
    main,
)
from rlshell.extensions import ENV_VAR
from rlshell.models import get_model
from rlshell.models.base import BasePolicy
from rlshell.runners.validation import load_config
from tests import launcher
from tests.shell.conftest import single_rank_group

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_EXT = ROOT / "examples" / "extension"
GRPO = ROOT / "configs" / "grpo.py"
CARTPOLE = ROOT / "configs" / "ppo_cartpole.py"
SAC_PENDULUM = ROOT / "configs" / "sac_pendulum.py"
STEP = 3


def move_weights(model: nn.Module, seed: int = 1) -> None:
    """Stand-in for training: every trained parameter moved off its initial value (a LoRA
    model's frozen base stays as built)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.requires_grad:
                parameter.add_(0.1 * noise.to(parameter.dtype))


def save_like_the_runner(
    run_dir: Path, written: Config, built: Config | None = None, tokenizer_dir: Path | None = None
) -> tuple[Path, nn.Module]:
    """``config.json`` (``written``) and checkpoint ``STEP`` of the actor ``built`` configures.

    As the reasoning and embodied runners save: the FSDP actor's shards under
    ``actor/``, the run's tokenizer (reasoning runs), ``trainer_state.json``, the
    manifest, committed from a staging directory. Returns the checkpoint and the saved model.
    """
    built = built or written
    with single_rank_group():
        manager = FSDPModelManager(built.actor, total_steps=1, device=torch.device("cpu"))
        manager.setup_model_and_optimizer()
        model = manager.module
        move_weights(model)
        write_config(written, run_dir / "config.json")
        staging = staging_dir(run_dir, STEP)
        manager.save_checkpoint(staging / "actor", STEP)
        if tokenizer_dir is not None:
            shutil.copytree(tokenizer_dir, staging / "tokenizer")
        write_trainer_state(staging, TrainerState(STEP, 0, 0, written.runner.experiment_name))
        write_manifest(staging)
        checkpoint = commit(staging, run_dir, STEP)
    return checkpoint, model.eval()


@pytest.fixture(scope="module")
def reasoning_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nn.Module]:
    # Imported here: the extension test's child processes import this module without Ray.
    from rlshell.tokenizer import prepare_tokenizer, with_tokenizer_ids

    run_dir = tmp_path_factory.mktemp("grpo")
    written = load_config(GRPO)
    tokenizer_dir = prepare_tokenizer(written, run_dir)
    built = with_tokenizer_ids(written, tokenizer_dir)
    return save_like_the_runner(run_dir, written, built, tokenizer_dir)


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nn.Module]:
    return save_like_the_runner(tmp_path_factory.mktemp("ppo_cartpole"), load_config(CARTPOLE))


def eval_actions(policy: nn.Module, obs: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
    """``predict_action_batch(mode="eval")``: the actions, their log-probs, and the values
    of a policy with a value head."""
    assert isinstance(policy, BasePolicy)
    with torch.no_grad():
        actions, info = policy.predict_action_batch(dict(obs), mode="eval", compute_values=True)
    values = info.get("prev_values")
    return (actions, info["prev_logprobs"], *([] if values is None else [values]))


def assert_same_state(model: nn.Module, reference: nn.Module) -> None:
    state, expected = model.state_dict(), reference.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name


def assert_exported_final_policy(run_dir: Path, last: str) -> None:
    """After a run (checkpoint.export_hf): ``<run dir>/policy`` is its last checkpoint's policy."""
    exported = load_exported(run_dir / POLICY_EXPORT_DIR)
    assert_same_state(exported, load_policy(run_dir / "checkpoints" / last).model)


def export_here(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``python -m rlshell.export ARGS`` in this process: exit status, stdout, stderr."""
    status = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env.update(extra)
    return env


# --- what each kind of checkpoint exports to --------------------------------------------------


def test_a_reasoning_checkpoint_exports_a_hugging_face_model_and_tokenizer(
    reasoning_run: tuple[Path, nn.Module], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint, trained = reasoning_run
    # The vocabulary comes from the tokenizer when the runner starts, after config.json is written.
    written = read_config_source(run_config_path(checkpoint))
    assert "vocab_size" not in written["actor"]["model"]["model_kwargs"]
    out = tmp_path / "hf_model"
    result = launcher.run(
        [sys.executable, "-m", "rlshell.export", str(checkpoint), str(out)],
        env=child_env(),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert f"exported {checkpoint} to {out}" in result.stdout
    assert not (out / MODEL_CONFIG_FILE).exists()
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    ids = tokenizer(["12+30="], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, trained(ids).logits)


def test_a_lora_checkpoint_exports_the_merged_model_which_loads_without_peft(
    tmp_path: Path,
) -> None:
    """The checkpoint holds the adapters only; the export is the plain model with them merged."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from rlshell.tokenizer import prepare_tokenizer, with_tokenizer_ids

    written = load_config(GRPO, ["actor.model.is_lora=true", "actor.model.lora_rank=4"])
    tokenizer_dir = prepare_tokenizer(written, tmp_path)
    built = with_tokenizer_ids(written, tokenizer_dir)
    checkpoint, trained = save_like_the_runner(tmp_path / "run", written, built, tokenizer_dir)
    out = export_checkpoint(checkpoint, tmp_path / "hf_model")
    assert not (out / "adapter_config.json").exists()
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        names = set(weights.keys())
    plain = get_model(evolve(built.actor.model, is_lora=False))
    assert names == set(plain.state_dict())  # the plain model's names: no lora_*, no base_layer
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    ids = torch.randint(0, 10, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, trained(ids).logits, rtol=0, atol=1e-5)
        assert not torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-3)


def test_an_mlp_policy_exports_its_weights_and_model_config(
    cartpole_run: tuple[Path, nn.Module], tmp_path: Path
) -> None:
    checkpoint, trained = cartpole_run
    out = export_checkpoint(checkpoint, tmp_path / "policy")
    assert sorted(path.name for path in out.iterdir()) == [WEIGHTS_FILE, MODEL_CONFIG_FILE]
    written = json.loads((out / MODEL_CONFIG_FILE).read_text())
    assert CONVERTER.structure(written, ModelConfig) == load_config(CARTPOLE).actor.model
    loaded = load_exported(out)
    assert_same_state(loaded, trained)
    assert not loaded.training
    obs = {"states": torch.randn(6, 4, generator=torch.Generator().manual_seed(0))}
    for got, expected in zip(eval_actions(loaded, obs), eval_actions(trained, obs), strict=True):
        assert torch.equal(got, expected)
    # The moved weights are what acts: the freshly built policy's values differ.
    fresh = get_model(load_config(CARTPOLE).actor.model).eval()
    assert not torch.equal(eval_actions(fresh, obs)[2], eval_actions(loaded, obs)[2])


@pytest.mark.parametrize("is_lora", [False, True], ids=["full", "lora"])
def test_a_tiny_vla_exports_as_a_policy_not_as_its_language_model(
    tmp_path: Path, is_lora: bool
) -> None:
    """With LoRA the checkpoint holds the adapters and the value head only; the export loads
    them into the base the model type builds, and writes the adapted policy whole."""
    from tests.shell.test_vla import model_config, observation

    cartpole = load_config(CARTPOLE)
    extra = {"is_lora": True, "lora_rank": 4} if is_lora else {}
    config = evolve(
        cartpole,
        actor=evolve(cartpole.actor, model=model_config(action_dim=1, **extra)),
        env=EnvConfig(
            env_type="gymnasium_pixels",
            env_id="CartPole-v1",
            num_envs=2,
            control_mode="continuous",
        ),
    )
    checkpoint, trained = save_like_the_runner(tmp_path / "vla", config)
    out = export_checkpoint(checkpoint, tmp_path / "policy")
    assert (out / WEIGHTS_FILE).is_file()
    assert not (out / "config.json").exists()
    loaded = load_exported(out)
    assert_same_state(loaded, trained)
    obs = observation(3)
    for got, expected in zip(eval_actions(loaded, obs), eval_actions(trained, obs), strict=True):
        assert torch.equal(got, expected)


def test_a_sac_checkpoint_exports_the_learners_policy(tmp_path: Path) -> None:
    from rlshell.workers.sac_update import SACLearner
    from rlshell.workers.sac_workers import LEARNER_STATE, sac_settings

    config = load_config(SAC_PENDULUM, ["actor.model.model_kwargs.hidden_sizes=32,32"])
    torch.manual_seed(config.actor.seed)
    policy = get_model(config.actor.model)
    move_weights(policy)
    assert isinstance(policy, BasePolicy)
    learner = SACLearner(policy, 1, sac_settings(config))
    run_dir = tmp_path / "sac"
    write_config(config, run_dir / "config.json")
    checkpoint = checkpoint_dir(run_dir, STEP)
    checkpoint.mkdir(parents=True)
    torch.save({"step": STEP, "learner": learner.state_dict()}, checkpoint / LEARNER_STATE)
    write_trainer_state(checkpoint, TrainerState(STEP, 0, 0, "sac"))
    write_manifest(checkpoint)
    loaded = load_exported(export_checkpoint(checkpoint, tmp_path / "policy"))
    assert_same_state(loaded, policy)
    obs = {"states": torch.randn(5, 3, generator=torch.Generator().manual_seed(0))}
    policy.eval()
    for got, expected in zip(eval_actions(loaded, obs), eval_actions(policy, obs), strict=True):
        assert torch.equal(got, expected)


_WRITE_EXTENSION_CHECKPOINT = """
import sys
from pathlib import Path

import torch

from rlshell.runners.validation import load_config
from rlshell.extensions import load_extensions
from tests.shell.test_export import CARTPOLE, save_like_the_runner

load_extensions()
run_dir = Path(sys.argv[1])
kwargs = '{"obs_dim": 4, "num_actions": 2, "hidden": 8}'
config = load_config(
    CARTPOLE, ["actor.model.model_type=bandit_mlp", f"actor.model.model_kwargs={kwargs}"]
)
checkpoint, trained = save_like_the_runner(run_dir, config)
obs = torch.linspace(-1.0, 1.0, 12).reshape(3, 4)
with torch.no_grad():
    torch.save({"obs": obs, "outputs": trained(obs)}, run_dir / "reference.pt")
print(checkpoint)
"""

_LOAD_EXPORTED = """
import sys

import torch

from rlshell.export import load_exported

model = load_exported(sys.argv[1])
reference = torch.load(sys.argv[2])
with torch.no_grad():
    torch.save(model(reference["obs"]), sys.argv[3])
print(f"{type(model).__module__}.{type(model).__qualname__}")
"""


def test_an_extensions_model_is_exported_and_loaded_back_as_its_own_class(tmp_path: Path) -> None:
    pythonpath = os.pathsep.join([str(EXAMPLE_EXT), os.environ.get("PYTHONPATH", "")])
    env = child_env(**{ENV_VAR: "rlshell_example_ext", "PYTHONPATH": pythonpath})

    def child(*args: str) -> str:
        result = launcher.run([sys.executable, *args], env=env, timeout=180)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    run_dir = tmp_path / "bandit"
    checkpoint = child("-c", _WRITE_EXTENSION_CHECKPOINT, str(run_dir))
    out = tmp_path / "policy"
    child("-m", "rlshell.export", checkpoint, str(out))
    assert json.loads((out / MODEL_CONFIG_FILE).read_text())["model_type"] == "bandit_mlp"
    reference, outputs = run_dir / "reference.pt", tmp_path / "outputs.pt"
    loaded_class = child("-c", _LOAD_EXPORTED, str(out), str(reference), str(outputs))
    assert loaded_class == "rlshell_example_ext.policy.BanditPolicy"
    expected = torch.load(reference)["outputs"]
    for got, want in zip(torch.load(outputs), expected, strict=True):
        assert torch.equal(got, want)
    assert "rlshell_example_ext" not in sys.modules


# --- the end of a run ---------------------------------------------------------------------------


def test_the_end_of_run_export_follows_checkpoint_export_hf(
    reasoning_run: tuple[Path, nn.Module], cartpole_run: tuple[Path, nn.Module], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    for name, (checkpoint, trained) in {"grpo": reasoning_run, "cartpole": cartpole_run}.items():
        run_dir = tmp_path / name
        shutil.copytree(checkpoint.parent.parent, run_dir)
        config = load_config(run_dir / "config.json")
        off = evolve(config, checkpoint=evolve(config.checkpoint, export_hf=False))
        never_saved = evolve(config, checkpoint=evolve(config.checkpoint, interval=0))
        assert export_final_policy(off, run_dir) is None
        assert export_final_policy(never_saved, run_dir) is None
        assert not (run_dir / "hf_model").exists()
        assert not (run_dir / "policy").exists()
        exported = export_final_policy(config, run_dir)
        if name == "grpo":
            assert exported == run_dir / "hf_model"
            model = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
        else:
            assert exported == run_dir / "policy"
            model = load_exported(exported)
        assert_same_state(model, trained)


# --- errors -------------------------------------------------------------------------------------


def test_a_missing_checkpoint_names_the_runs_checkpoints(
    cartpole_run: tuple[Path, nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, _ = cartpole_run
    status, _, err = export_here(capsys, checkpoint.with_name("global_step_9"), tmp_path / "out")
    assert status == 1
    assert "global_step_9 does not exist; the run has global_step_3" in err
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_away_from_its_run_config_needs_config(
    cartpole_run: tuple[Path, nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, trained = cartpole_run
    moved = tmp_path / "copied" / checkpoint.name
    shutil.copytree(checkpoint, moved)
    out = tmp_path / "policy"
    status, _, err = export_here(capsys, moved, out)
    assert status == 1
    assert f"no run config at {tmp_path / 'config.json'}" in err
    assert "Give the run's config with --config PATH" in err
    config = run_config_path(checkpoint)
    status, stdout, err = export_here(capsys, moved, out, "--config", config)
    assert status == 0, err
    assert stdout == f"exported {moved} to {out}\n"
    assert_same_state(load_exported(out), trained)


def test_overrides_apply_and_weights_that_do_not_fit_leave_the_last_export(
    cartpole_run: tuple[Path, nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, _ = cartpole_run
    out = tmp_path / "policy"
    assert export_here(capsys, checkpoint, out)[0] == 0
    before = (out / WEIGHTS_FILE).read_bytes()
    config = run_config_path(checkpoint)
    status, _, err = export_here(
        capsys, checkpoint, out, "--config", config, "actor.model.model_kwargs.hidden_sizes=16"
    )
    assert status == 1
    assert "actor/.metadata does not fit the MLPPolicy that actor.model builds" in err
    assert (out / WEIGHTS_FILE).read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["policy"]
    # Exported again over the last export: nothing staged or set aside is left beside it.
    assert export_here(capsys, checkpoint, out)[0] == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["policy"]
    assert (out / WEIGHTS_FILE).read_bytes() == before
    status, _, err = export_here(capsys, checkpoint, out, "actor.model.lora_rnak=4")
    assert status == 2
    assert "unknown key 'actor.model.lora_rnak' (did you mean 'actor.model.lora_rank'?)" in err


def test_an_extension_that_fails_to_import_stops_the_export(
    cartpole_run: tuple[Path, nn.Module],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint, _ = cartpole_run
    monkeypatch.setenv(ENV_VAR, "rlshell_no_such_extension")
    status, _, err = export_here(capsys, checkpoint, tmp_path / "out")
    assert status == 2
    assert f"{ENV_VAR} module 'rlshell_no_such_extension' could not be imported" in err
    assert "on the export (host" in err
    assert not (tmp_path / "out").exists()


def test_load_exported_names_what_a_directory_lacks(
    reasoning_run: tuple[Path, nn.Module], tmp_path: Path
) -> None:
    checkpoint, _ = reasoning_run
    hf = export_checkpoint(checkpoint, tmp_path / "hf_model")
    with pytest.raises(ExportError, match="a Hugging Face export; load it with AutoModelForCausal"):
        load_exported(hf)
    with pytest.raises(ExportError, match=f"has no {MODEL_CONFIG_FILE}$"):
        load_exported(tmp_path)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    model = ModelConfig(model_type="bandit_mlp", category="embodied")
    (foreign / MODEL_CONFIG_FILE).write_text(json.dumps(CONVERTER.unstructure(model)))
    with pytest.raises(ExportError, match=f"has no {WEIGHTS_FILE}: the export is incomplete"):
        load_exported(foreign)
    (foreign / WEIGHTS_FILE).write_bytes(b"")
    with pytest.raises(ExportError, match=f"unknown model type 'bandit_mlp'.*once {ENV_VAR} names"):
        load_exported(foreign)


def test_a_damaged_or_altered_checkpoint_is_refused_before_any_byte_is_read(
    cartpole_run: tuple[Path, nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, _ = cartpole_run
    shutil.copytree(checkpoint.parent.parent, tmp_path / "run")
    copy = tmp_path / "run" / "checkpoints" / checkpoint.name
    # One flipped byte in a shard: same size, another hash.
    shard = next(path for path in (copy / "actor").iterdir() if path.suffix == ".distcp")
    original = shard.read_bytes()
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    status, _, err = export_here(capsys, copy, tmp_path / "out")
    assert status == 1
    assert f"{shard} does not match its SHA-256 in the manifest (corrupted)" in err
    assert not (tmp_path / "out").exists()
    # The attack: a pickle in DCP's .metadata that would run code when read. The manifest
    # check refuses it before torch.distributed.checkpoint unpickles anything.
    shard.write_bytes(original)
    marker = tmp_path / "payload_ran"
    (copy / "actor" / ".metadata").write_bytes(pickle.dumps(_WritesAFile(str(marker))))
    status, _, err = export_here(capsys, copy, tmp_path / "out")
    assert status == 1
    assert f"{copy / 'actor' / '.metadata'} has " in err
    assert "the manifest says" in err
    assert not marker.exists()
    assert not (tmp_path / "out").exists()
    # The same with the manifest recomputed over the forged file (a run directory from
    # someone else): the manifest passes, and the metadata's reader refuses the class its
    # pickle asks for before building it.
    write_manifest(copy)
    status, _, err = export_here(capsys, copy, tmp_path / "out")
    assert status == 1
    assert "refused to read it: its pickle asks for pathlib.Path.write_text" in err
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


class _WritesAFile:
    """Unpickling this writes ``path``: what a forged ``.metadata`` could make a reader do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[Path, str]]:
        return (Path.write_text, (Path(self.path), "the payload ran"))
