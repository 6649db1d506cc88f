"""docs/core.md's verl mapping, proven against verl's own functions (pinned: verl 0.9.1).

verl is not installed beside rlstack: `verl_environment` builds a separate virtual
environment under the user's cache directory (``$RLSTACK_PEER_CACHE``, default
``~/.cache/rlstack/peers``), once, with ``pip install --no-deps`` of the pins below.
verl's ``core_algos`` needs only omegaconf and codetiming beyond what this test
environment holds; a ``.pth`` file lends the environment this one's site-packages
(torch, numpy, tensordict, transformers, ray, ...), and the script puts this
checkout's ``src`` first on its path. ``verl_parity.py`` then feeds the same random
float64 inputs to verl's functions and to the rlcore calls the docs name, and prints
each check's largest difference.

The test is skipped only when the package index cannot be reached; any other failure
to build the environment fails it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
import venv
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("verl_parity.py")
PINS = ("verl==0.9.1", "omegaconf==2.4.0", "codetiming==1.4.0")
# verl sums with 1e-8 added to its counts (masked_mean); everything else agrees to rounding.
TOLERANCE = 1e-6

# The rows of docs/core.md's verl table, each a check of verl_parity.py.
MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean")
ALL_MODES = (*MODES, "seq-mean-token-sum-norm")
VERL_KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
CHECKS = (
    "gae",
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline[score]",
    "reinforce_pp_baseline[reward_to_go, gamma=1, outcome]",
    *(f"{loss}[{mode}]" for mode in ALL_MODES for loss in ("ppo_dual_clip", "vanilla", "gspo")),
    *(f"value_loss[{mode}]" for mode in ALL_MODES),
    *(f"aggregate[{mode}]" for mode in ALL_MODES),
    *(f"aggregate[{mode}, fully masked rows]" for mode in ALL_MODES),
    *(f"global_normalizer[{mode}]" for mode in MODES),
    *(f"kl[{kind}]" for kind in (*VERL_KL_KINDS, *(f"{k}+" for k in VERL_KL_KINDS))),
)

pytestmark = pytest.mark.xdist_group("verl_peer")


def _index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def _index_unreachable() -> str | None:
    """Why the package index cannot be reached, or None when it answers."""
    url = f"{_index_url()}/verl/"
    try:
        with urllib.request.urlopen(url, timeout=20):
            return None
    except (urllib.error.URLError, OSError) as error:
        return f"{url}: {error}"


def _environment_dir() -> Path:
    """One environment per pins, interpreter and lent site-packages."""
    cache = Path(os.environ.get("RLSTACK_PEER_CACHE", Path.home() / ".cache/rlstack/peers"))
    host = sysconfig.get_paths()["purelib"]
    key = hashlib.sha256(repr((PINS, sys.version, host)).encode()).hexdigest()[:12]
    return cache / f"verl-0.9.1-{key}"


def _build(target: Path) -> None:
    """A venv at ``target`` holding the pins, lent this environment's site-packages."""
    building = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(building)
    python = building / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    host = sysconfig.get_paths()["purelib"]
    Path(purelib, "zz_rlstack_host.pth").write_text(f"import site; site.addsitedir({host!r})\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    install = subprocess.run(
        [*pip, "--no-deps", "--no-input", "--disable-pip-version-check", *PINS],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if install.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        unreachable = _index_unreachable()
        if unreachable is not None:
            pytest.skip(f"the package index cannot be reached to install {PINS}: {unreachable}")
        pytest.fail(f"pip could not install {PINS} into {building}:\n{install.stderr}")
    try:
        building.rename(target)
    except OSError:  # another process built it first
        shutil.rmtree(building, ignore_errors=True)


@pytest.fixture(scope="session")
def verl_environment() -> Path:
    """The Python of the peer environment (built on first use, then reused)."""
    target = _environment_dir()
    if not (target / "bin" / "python").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        _build(target)
    return target / "bin" / "python"


@pytest.fixture(scope="session")
def parity(verl_environment: Path) -> dict[str, Any]:
    """What verl_parity.py found: the checks' largest differences and the worked examples."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VERL_USE_EXTERNAL_PLUGINS": "none"}
    run = subprocess.run(
        [str(verl_environment), str(SCRIPT), str(ROOT / "src")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, f"verl_parity.py failed:\n{run.stderr[-5000:]}"
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def test_the_peer_is_the_pinned_verl(parity: dict[str, Any]) -> None:
    assert parity["verl"] == "0.9.1"
    assert sorted(parity["checks"]) == sorted(CHECKS)


@pytest.mark.parametrize("name", CHECKS)
def test_rlcore_computes_what_verl_computes(parity: dict[str, Any], name: str) -> None:
    found = parity["checks"][name]
    assert found["cases"] >= 20, found
    assert found["max_abs_diff"] <= TOLERANCE, f"{name}: {found}"


def test_verl_divides_seq_mean_token_sum_norm_by_its_non_empty_rows_times_l(
    parity: dict[str, Any],
) -> None:
    """Loss [[1, 1, 1, 1], [4, 0, 0, 0]], mask [[1, 1, 1, 1], [1, 0, 0, 0]], L = 4: both
    divide the token sum 8 by 2 · 4; passing normalizer=L (the mapping the docs gave for an
    older verl) doubles it."""
    assert parity["examples"]["seq-mean-token-sum-norm"] == {
        "verl": 1.0,
        "rlcore": 1.0,
        "rlcore_normalizer_L": 2.0,
    }


def test_verls_reinforce_pp_baseline_is_rlcores_score_form(parity: dict[str, Any]) -> None:
    """One group of 2, rewards [[0, 1], [0, 0]], γ = 0.9: verl ±0.866 on every token (γ not
    read), rlcore's reward-to-go form [[0.7727, 0.9545], [−0.8636, −0.8636]]."""
    example = {
        side: [value for row in rows for value in row]
        for side, rows in parity["examples"]["reinforce_pp_baseline"].items()
    }
    half = 0.8660254
    assert example["verl"] == pytest.approx([half, half, -half, -half], abs=1e-6)
    assert example["rlcore_score"] == pytest.approx(example["verl"], abs=1e-6)
    expected = [0.7727, 0.9545, -0.8636, -0.8636]
    assert example["rlcore_reward_to_go"] == pytest.approx(expected, abs=1e-4)
