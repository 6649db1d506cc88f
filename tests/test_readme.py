"""The README's code runs, and its commands exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_readme_python_examples_run() -> None:
    snippets = blocks("python")
    assert snippets, "the README shows no python example"
    for snippet in snippets:
        result = subprocess.run(
            [sys.executable, "-c", snippet], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert result.returncode == 0, f"README example failed:\n{snippet}\n{result.stderr}"


def test_readme_opens_with_the_two_setup_commands_and_they_are_make_targets() -> None:
    first = blocks("bash")[0]
    commands = [line.split("#")[0].strip() for line in first.strip().splitlines()]
    assert commands == ["make install", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("install", "test", "bench", "pytest"):
        assert re.search(rf"^{target}:", makefile, flags=re.MULTILINE), f"no make target {target}"
