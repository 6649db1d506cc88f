"""Signed checkpoint manifests (`rlshell.signing`): a run directory proven to be your own.

The attack each test stops: a checkpoint from elsewhere, its files altered and its manifest
recomputed over them, passes the manifest's sizes and SHA-256s; with a key, it is refused
before a byte of it is read.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rlshell.checkpoint import (
    MANIFEST,
    CheckpointError,
    resolve_resume,
    verify_checkpoint,
    write_manifest,
)
from rlshell.signing import KEY_ENV_VAR, SigningError, load_key, write_key
from tests.shell.test_checkpoint_faults import _save


def _key(path: Path) -> Path:
    write_key(path)
    return path


def test_keygen_writes_a_private_key_and_never_overwrites_one(tmp_path: Path) -> None:
    key = tmp_path / "key"
    command = [sys.executable, "-m", "rlshell.signing", "keygen", str(key)]
    made = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert f"export {KEY_ENV_VAR}={key}" in made.stdout
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert len(key.read_text().strip()) == 64
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1
    assert "a key is never overwritten" in again.stderr


def test_an_unusable_key_is_named_with_what_is_wrong(tmp_path: Path) -> None:
    assert load_key({}) is None
    with pytest.raises(SigningError, match=r"cannot read the signing key \(No such file"):
        load_key({KEY_ENV_VAR: str(tmp_path / "missing")})
    short = tmp_path / "short"
    short.write_text("abc")
    short.chmod(0o600)
    with pytest.raises(SigningError, match="has 3 bytes, fewer than 32"):
        load_key({KEY_ENV_VAR: str(short)})
    shared = _key(tmp_path / "shared")
    shared.chmod(0o644)
    with pytest.raises(SigningError, match=r"readable by others \(mode 0644\); `chmod 600"):
        load_key({KEY_ENV_VAR: str(shared)})


def test_with_a_key_only_checkpoints_signed_with_it_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, theirs = _key(tmp_path / "mine"), _key(tmp_path / "theirs")
    unsigned = _save(tmp_path / "unsigned", 1)
    monkeypatch.setenv(KEY_ENV_VAR, str(mine))
    signed = _save(tmp_path / "run", 1)
    manifest = json.loads((signed / MANIFEST).read_text())
    assert set(manifest["signature"]) == {"algorithm", "key_id", "mac"}
    assert mine.read_text().strip() not in (signed / MANIFEST).read_text()
    verify_checkpoint(signed)
    with pytest.raises(CheckpointError, match="is not signed"):
        verify_checkpoint(unsigned)

    # The forger's way: alter a shard, recompute the manifest (unsigned: no key), or sign it
    # with a key of their own, or keep the old signature.
    shard = signed / "actor" / "shard_0.bin"
    shard.write_bytes(b"weights of the forger's choosing")
    old_signature = manifest["signature"]
    monkeypatch.delenv(KEY_ENV_VAR)
    write_manifest(signed)
    verify_checkpoint(signed)  # without the key, the recomputed manifest verifies
    monkeypatch.setenv(KEY_ENV_VAR, str(mine))
    with pytest.raises(CheckpointError, match="is not signed"):
        verify_checkpoint(signed)
    monkeypatch.setenv(KEY_ENV_VAR, str(theirs))
    write_manifest(signed)
    monkeypatch.setenv(KEY_ENV_VAR, str(mine))
    with pytest.raises(CheckpointError, match=r"signed with another key \(key id [0-9a-f]{16}"):
        verify_checkpoint(signed)
    forged = json.loads((signed / MANIFEST).read_text())
    forged["signature"] = old_signature
    (signed / MANIFEST).write_text(json.dumps(forged))
    with pytest.raises(CheckpointError, match="does not match its file list"):
        verify_checkpoint(signed)


def test_resume_auto_with_a_key_skips_what_is_not_signed_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.setenv(KEY_ENV_VAR, str(_key(tmp_path / "key")))
    _save(run_dir, 1)
    monkeypatch.delenv(KEY_ENV_VAR)
    _save(run_dir, 2)  # written without the key: as a run directory from elsewhere
    monkeypatch.setenv(KEY_ENV_VAR, str(tmp_path / "key"))
    assert resolve_resume("auto", run_dir) == run_dir / "checkpoints" / "global_step_1"
    assert "skipped global_step_2" in capsys.readouterr().err
    monkeypatch.setenv(KEY_ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(SigningError, match="cannot read the signing key"):
        resolve_resume("auto", run_dir)  # not a reason to skip every checkpoint: it stops


def test_verify_names_the_checkpoint_and_the_reason(tmp_path: Path) -> None:
    key = _key(tmp_path / "key")
    env = {**os.environ, KEY_ENV_VAR: str(key)}
    checkpoint = _save(tmp_path / "run", 1)  # unsigned
    command = [sys.executable, "-m", "rlshell.checkpoint", "verify", str(checkpoint)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 1
    assert f"{checkpoint} is not signed" in refused.stderr
    env.pop(KEY_ENV_VAR)
    plain = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert plain.returncode == 0, plain.stderr
    assert "every file matches its manifest (no signing key set)" in plain.stdout


def test_a_run_with_a_key_it_cannot_use_stops_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlshell.runners.run_checks import run_only_problems
    from rlshell.runners.validation import load_config

    config = load_config(Path("configs/ppo_cartpole.py"), [f"runner.output_dir={tmp_path}"])
    monkeypatch.setenv(KEY_ENV_VAR, str(tmp_path / "missing"))
    (problem,) = run_only_problems(config)
    assert problem.startswith(f"{KEY_ENV_VAR}={tmp_path / 'missing'}: cannot read the signing key")
    monkeypatch.setenv(KEY_ENV_VAR, str(_key(tmp_path / "key")))
    assert run_only_problems(config) == []
