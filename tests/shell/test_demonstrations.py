"""Demonstrations: recorded, saved without pickle, verified on load, cut into sft rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from attrs import evolve

from rlshell.config import EnvConfig
from rlshell.demonstrations import (
    DemonstrationError,
    Demonstrations,
    load_demonstrations,
    record_demonstrations,
    save_demonstrations,
)
from rlshell.envs.stepper import EnvObs, EnvStepper
from rlshell.record import main


def pendulum_expert(obs: EnvObs) -> torch.Tensor:
    """Energy-shaping swing-up: a deterministic expert of the right shape and range."""
    cos, sin, velocity = obs["states"].unbind(-1)
    angle = torch.atan2(sin, cos)
    return (-2.0 * angle - 0.5 * velocity).clamp(-2.0, 2.0)[:, None]


def pendulum_stepper(num_envs: int = 2, max_steps: int = 7) -> EnvStepper:
    config = EnvConfig(
        env_type="gymnasium", env_id="Pendulum-v1", num_envs=num_envs, max_episode_steps=max_steps
    )
    return EnvStepper.from_config(config)


def recorded(episodes: int = 3) -> Demonstrations:
    return record_demonstrations(pendulum_stepper(), pendulum_expert, episodes, 0, name="swing")


def test_recorded_episodes_are_whole_in_order_and_survive_a_round_trip(tmp_path: Path) -> None:
    demos = recorded(episodes=3)
    assert len(demos) == 3 * 7
    assert demos.episodes == 3
    assert demos.episode.tolist() == [e for e in range(3) for _ in range(7)]
    assert demos.obs["states"].shape == (21, 3)
    assert demos.actions.shape == (21, 1)
    # The actions are the expert's at the recorded observations.
    torch.testing.assert_close(demos.actions, pendulum_expert(demos.obs))
    path = save_demonstrations(demos, tmp_path / "swing.safetensors")
    again = load_demonstrations(path)
    assert again.env_id == "Pendulum-v1"
    assert again.expert == "swing"
    for key in ("actions", "episode", "success"):
        assert torch.equal(getattr(again, key), getattr(demos, key))
    assert torch.equal(again.obs["states"], demos.obs["states"])


def test_chunked_rows_take_the_next_actions_of_their_episode_and_repeat_its_last(
    tmp_path: Path,
) -> None:
    demos = Demonstrations(
        obs={"states": torch.arange(5, dtype=torch.float32)[:, None]},
        actions=torch.arange(5, dtype=torch.float32)[:, None],
        episode=torch.tensor([0, 0, 0, 1, 1]),
        success=torch.tensor([True, False]),
        env_id="x",
        expert="y",
    )
    obs, actions = demos.sft_batch(torch.tensor([1, 2, 3]), chunk=3)
    assert obs["states"].flatten().tolist() == [1.0, 2.0, 3.0]
    assert actions.squeeze(-1).tolist() == [[1, 2, 2], [2, 2, 2], [3, 4, 4]]
    assert demos.sft_batch(torch.tensor([4]), chunk=1)[1].tolist() == [[4.0]]
    train, held_out = demos.split(1)
    assert train.episode.tolist() == [0, 0, 0]
    assert held_out.episode.tolist() == [0, 0]
    assert held_out.success.tolist() == [False]


def test_only_successful_episodes_are_kept_when_asked() -> None:
    # Pendulum reports no success: asking for successes only never finishes, and says why.
    with pytest.raises(RuntimeError, match=r"0 of 2 episodes kept .*does the expert succeed"):
        record_demonstrations(
            pendulum_stepper(), pendulum_expert, 2, 0, name="swing", only_success=True, max_steps=30
        )


def test_a_damaged_or_altered_file_is_refused_naming_what_is_wrong(tmp_path: Path) -> None:
    path = save_demonstrations(recorded(episodes=2), tmp_path / "d.safetensors")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a byte of the last tensor's data
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(bytes(data))
    with pytest.raises(DemonstrationError, match="damaged or was altered"):
        load_demonstrations(damaged)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(DemonstrationError, match="not a safetensors file"):
        load_demonstrations(tmp_path / "junk.safetensors")
    with pytest.raises(DemonstrationError, match="no such file"):
        load_demonstrations(tmp_path / "missing.safetensors")
    # Content a writer got wrong is refused on save as on load.
    bad = recorded(episodes=1)
    broken = evolve(bad, actions=bad.actions.clone())
    broken.actions[3] = math.nan
    with pytest.raises(DemonstrationError, match=r"non-finite actions at steps \[3\]"):
        save_demonstrations(broken, tmp_path / "nan.safetensors")
    with pytest.raises(DemonstrationError, match="episode indices must start at 0"):
        save_demonstrations(evolve(bad, episode=bad.episode + 1), tmp_path / "e.safetensors")


def test_the_command_shows_a_file_and_refuses_an_unknown_expert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save_demonstrations(recorded(episodes=2), tmp_path / "d.safetensors")
    assert main(["--show", str(path)]) == 0
    assert "14 steps of 2 episodes of Pendulum-v1 by swing" in capsys.readouterr().out
    code = main(
        [
            "configs/ppo_halfcheetah.py",
            "--expert",
            "oracle",
            "--episodes",
            "1",
            "--out",
            str(tmp_path / "o.safetensors"),
        ]
    )
    assert code == 2
    assert "--expert: 'metaworld' or 'checkpoint:PATH'" in capsys.readouterr().err


def cartpole(env_type: str, max_steps: int = 30) -> EnvStepper:
    config = EnvConfig(
        env_type=env_type, env_id="CartPole-v1", num_envs=2, max_episode_steps=max_steps
    )
    return EnvStepper.from_config(config)


def balance(obs: EnvObs) -> torch.Tensor:
    """Push the cart the way the pole leans: CartPole's expert from its state."""
    return (obs["states"][:, 2] + 0.5 * obs["states"][:, 3] > 0).long()


def test_a_camera_is_recorded_in_lockstep_with_the_state_the_expert_reads() -> None:
    # The expert reads CartPole's state; the demonstrations hold what a pixel policy sees.
    demos = record_demonstrations(
        cartpole("gymnasium"), balance, 3, 0, name="balance", observed=cartpole("gymnasium_pixels")
    )
    assert set(demos.obs) == {"main_images", "task_descriptions"}
    assert demos.obs["main_images"].shape[1:] == (64, 64, 3)
    state_only = record_demonstrations(cartpole("gymnasium"), balance, 3, 0, name="balance")
    # Same episodes, step for step: the same actions at the same steps.
    assert torch.equal(demos.episode, state_only.episode)
    assert torch.equal(demos.actions, state_only.actions)
    # The images move with the cart and pole the actions move.
    images = demos.obs["main_images"]
    first_episode = images[demos.episode == 0]
    assert any(not torch.equal(first_episode[0], image) for image in first_episode[1:])


def test_observed_envs_that_part_from_the_acting_ones_stop_the_recording() -> None:
    with pytest.raises(RuntimeError, match=r"parted from the acting ones at step 10 "):
        record_demonstrations(
            cartpole("gymnasium", max_steps=30),
            balance,
            3,
            0,
            name="balance",
            observed=cartpole("gymnasium", max_steps=10),
        )


def _write(path: str, text: str) -> None:
    Path(path).write_text(text)


class _WritesAFile:
    """Unpickling this writes a file: what a pickle-loading reader would run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (_write, (str(self.path), "ran"))


def test_a_pickle_posing_as_demonstrations_is_refused_without_running(tmp_path: Path) -> None:
    import pickle

    witness = tmp_path / "witness"
    posing = tmp_path / "demos.safetensors"
    posing.write_bytes(pickle.dumps(_WritesAFile(witness)))
    with pytest.raises(DemonstrationError, match="not a safetensors file"):
        load_demonstrations(posing)
    assert not witness.exists()
    # The same payload really does run when unpickled: the test would see it.
    pickle.loads(posing.read_bytes())
    assert witness.read_text() == "ran"
