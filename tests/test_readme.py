"""The README's code runs, and its commands exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests import launcher

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_readme_python_examples_run() -> None:
    snippets = blocks("python")
    assert snippets, "the README shows no python example"
    for snippet in snippets:
        # Forked from the warm interpreter, on the shared cluster (tests/launcher.py).
        result = launcher.run([sys.executable, "-c", snippet], env=dict(os.environ), timeout=120)
        assert result.returncode == 0, f"README example failed:\n{snippet}\n{result.stderr}"


def test_readme_opens_with_the_two_setup_commands_and_they_are_make_targets() -> None:
    first = blocks("bash")[0]
    commands = [line.split("#")[0].strip() for line in first.strip().splitlines()]
    assert commands == ["make install", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("install", "test", "bench", "pytest"):
        assert re.search(rf"^{target}:", makefile, flags=re.MULTILINE), f"no make target {target}"


def test_readme_shell_commands_after_the_setup_run(tmp_path: Path) -> None:
    """Every command in the README's later bash blocks runs (the probe one starts real Ray)."""
    import tempfile

    commands = [
        line.strip()
        for block in blocks("bash")[1:]
        for line in block.strip().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert commands, "the README shows no command after the setup block"
    ray_tmpdir = tempfile.mkdtemp(prefix="rm", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_TMPDIR": ray_tmpdir}
    for command in commands:
        assert command.startswith(".venv/bin/"), command
        argv = command.replace(".venv/bin/python", sys.executable, 1).split()
        result = launcher.run(argv, env=env, timeout=240)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    subprocess.run(["rm", "-rf", ray_tmpdir], check=False)
