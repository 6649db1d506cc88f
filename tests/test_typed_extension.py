"""The typed extension example (examples/typed_extension): it works, and mypy guards it.

Part one imports the package from its directory (it is not installed),
registers it, and proves its estimator (``win_rate``) and loss (``cispo``),
looked up by name, on rlcore.testing's hypothesis inputs.

Part two runs ``mypy --strict`` (through ``mypy.api``) on the package, then on
copies with one deliberate mistake each, and expects the exact error: the
file, the line and the error code. Two mistakes mypy cannot see (a wrong
jaxtyping dtype or shape: to mypy ``Float[Tensor, "b t"]`` is ``Tensor``) are
shown to pass mypy and to be caught by `rlcore.typecheck` on the first call.
All mypy runs share one cache, on one xdist worker (the module is one group): the
first fills it (about 40 s for torch's stubs from nothing, about 20 s when it starts
from a copy of the cache `make typecheck` left in the checkout), the others take a
second or two.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import attrs
import mypy.api
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from rlcore import TypeCheckError
from rlcore.advantages import AdvantageBatch, AdvantageConfig, rloo
from rlcore.losses import PolicyLossBatch, PolicyLossConfig
from rlcore.registry import ADVANTAGES, POLICY_LOSSES
from rlcore.testing import (
    TokenBatch,
    check_advantage_estimator,
    check_policy_loss,
    group_scores,
    token_batches,
)
from rlcore.tokens import place_on_last_token

# One worker runs the whole module, so the mypy cache is filled once (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("typed_extension")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "typed_extension"
PACKAGE = "rlstack_typed_ext"


@pytest.fixture(scope="module")
def ext() -> Iterator[ModuleType]:
    """The example package, imported from its directory and registered; unregistered after."""
    assert "win_rate" not in ADVANTAGES
    assert "cispo" not in POLICY_LOSSES
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLE))
        module = importlib.import_module(PACKAGE)
        module.register()
        try:
            yield module
        finally:
            ADVANTAGES.unregister("win_rate")
            POLICY_LOSSES.unregister("cispo")
            for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
                del sys.modules[name]


# ---------------------------------------------------------------------------
# The estimator: pairwise win rate within each prompt group.


def one_token_batch(scores: torch.Tensor) -> AdvantageBatch:
    """``[groups, n]`` scores as a token batch of one-token responses."""
    groups, size = scores.shape
    mask = torch.ones(groups * size, 1, dtype=torch.bool)
    return AdvantageBatch(scores.reshape(-1, 1), mask, group_size=size)


def win_rate(scores: torch.Tensor, margin: float = 0.0) -> torch.Tensor:
    """The registered estimator's per-response advantages, ``[groups, n]``."""
    from rlstack_typed_ext.advantages import WinRateEstimator

    estimator = ADVANTAGES.get("win_rate") if margin == 0.0 else WinRateEstimator(margin)
    advantages = estimator(one_token_batch(scores), AdvantageConfig()).advantages
    return advantages.view_as(scores)


@given(scores=group_scores())
def test_win_rate_is_bounded_centred_and_zero_for_equal_scores(
    ext: ModuleType, scores: torch.Tensor
) -> None:
    advantages = win_rate(scores)
    assert advantages.abs().max() <= 1
    torch.testing.assert_close(
        advantages.sum(dim=-1), torch.zeros(scores.shape[0], dtype=scores.dtype)
    )
    equal = (scores == scores[:, :1]).all(dim=-1)
    assert torch.all(advantages[equal] == 0)
    # The order of the scores is the order of the advantages.
    higher = scores.unsqueeze(-1) > scores.unsqueeze(-2)
    assert torch.all((advantages.unsqueeze(-1) > advantages.unsqueeze(-2))[higher])


@given(scores=group_scores(), transform=st.sampled_from(["exp", "affine", "cube"]))
def test_win_rate_depends_only_on_the_order_of_the_scores(
    ext: ModuleType, scores: torch.Tensor, transform: str
) -> None:
    changed = {
        "exp": torch.exp(scores),
        "affine": 1000.0 * scores - 3.0,
        "cube": scores.pow(3),
    }[transform]
    # Strictly increasing in exact arithmetic; rounding may merge two close scores.
    assume(torch.equal(order(changed), order(scores)))
    torch.testing.assert_close(win_rate(changed), win_rate(scores), rtol=0, atol=0)


def order(scores: torch.Tensor) -> torch.Tensor:
    return torch.sign(scores.unsqueeze(-1) - scores.unsqueeze(-2))


@given(scores=group_scores())
def test_win_rate_equals_rloo_on_binary_scores(ext: ModuleType, scores: torch.Tensor) -> None:
    binary = (scores > scores.mean(dim=-1, keepdim=True)).to(scores.dtype)
    torch.testing.assert_close(win_rate(binary), rloo(binary))


@given(scores=group_scores(), margin=st.floats(0.0, 25.0), fraction=st.floats(0.0, 0.99))
def test_a_margin_turns_only_close_scores_into_ties(
    ext: ModuleType, scores: torch.Tensor, margin: float, fraction: float
) -> None:
    advantages = win_rate(scores, margin)
    torch.testing.assert_close(
        advantages.sum(dim=-1), torch.zeros(scores.shape[0], dtype=scores.dtype)
    )
    spread = scores.amax(dim=-1) - scores.amin(dim=-1)
    assert torch.all(advantages[spread <= margin] == 0)
    # Below the smallest gap between two different scores, a margin changes nothing.
    gaps = (scores.unsqueeze(-1) - scores.unsqueeze(-2)).abs()
    if bool((gaps > 0).any()):
        below = fraction * float(gaps[gaps > 0].min())
        assert torch.equal(win_rate(scores, below), win_rate(scores))


def test_win_rate_by_hand(ext: ModuleType) -> None:
    scores = torch.tensor([[3.0, 1.0, 2.0, 2.0], [0.1, 40.0, 0.2, 0.3]])
    # Row 0: 3 beats all three (+1), 1 loses to all (−1), the two 2s win one, lose one, tie one.
    # Row 1: the outlier 40 is simply the best; GRPO would put the other three near −0.5.
    expected = torch.tensor([[1.0, -1.0, 0.0, 0.0], [-1.0, 1.0, -1 / 3, 1 / 3]])
    torch.testing.assert_close(win_rate(scores), expected)
    # A NaN score is never taken for a tie: its group's advantages are NaN, the others' are not.
    with_nan = win_rate(torch.tensor([[1.0, float("nan"), 0.0], [1.0, 2.0, 3.0]]))
    assert torch.isnan(with_nan[0]).all()
    torch.testing.assert_close(with_nan[1], torch.tensor([-1.0, 0.0, 1.0]))


def test_the_estimator_passes_the_rlcore_checks_and_reads_outcome_scores(ext: ModuleType) -> None:
    estimator = ADVANTAGES.get("win_rate")
    check_advantage_estimator(estimator, group_size=3, max_examples=30)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    batch = AdvantageBatch(place_on_last_token(torch.tensor([1.0, 0.0, 2.0, 5.0]), mask), mask, 2)
    expected = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0], [1.0] * 3])
    torch.testing.assert_close(estimator(batch, AdvantageConfig()).advantages, expected)


def test_register_is_idempotent_and_refuses_a_different_entry_unless_forced(
    ext: ModuleType,
) -> None:
    from rlstack_typed_ext.advantages import WinRateEstimator

    registered = ADVANTAGES.get("win_rate")
    ext.register()  # a second load of the extension changes nothing
    assert ADVANTAGES.get("win_rate") == registered
    ADVANTAGES.register("win_rate", WinRateEstimator(margin=0.5), force=True)
    with pytest.raises(KeyError, match=r"advantage estimator 'win_rate' is already registered"):
        ext.register()
    ext.register(force=True)
    assert ADVANTAGES.get("win_rate") == WinRateEstimator()
    with pytest.raises(ValueError, match="'win_rate' needs group_size >= 2"):
        registered(
            AdvantageBatch(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)), AdvantageConfig()
        )


# ---------------------------------------------------------------------------
# The loss: CISPO.


def loss_grad(
    name: str, batch: TokenBatch, config: PolicyLossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = batch.logprobs.clone().requires_grad_(True)
    loss = POLICY_LOSSES.get(name)(
        PolicyLossBatch(logprobs, batch.old_logprobs, batch.advantages, batch.mask), config
    ).loss
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.detach(), grad


@pytest.mark.parametrize(
    "config",
    [PolicyLossConfig(), PolicyLossConfig(clip_low=0.2, clip_high=0.28, agg="seq-mean-token-sum")],
    ids=["defaults", "clip_0.2_0.28_seq_mean"],
)
def test_cispo_passes_the_rlcore_policy_loss_checks(
    ext: ModuleType, config: PolicyLossConfig
) -> None:
    check_policy_loss(POLICY_LOSSES.get("cispo"), config, max_examples=30)


@given(batch=token_batches(), clip=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (1.0, 4.0)]))
def test_cispo_gradient_is_the_clipped_weight_times_the_advantage(
    ext: ModuleType, batch: TokenBatch, clip: tuple[float, float]
) -> None:
    clip_low, clip_high = clip
    _, grad = loss_grad("cispo", batch, PolicyLossConfig(clip_low=clip_low, clip_high=clip_high))
    ratio = torch.exp(batch.logprobs - batch.old_logprobs)
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    count = batch.mask.sum().clamp(min=1)
    expected = torch.where(batch.mask, -weight * batch.advantages / count, 0.0)
    torch.testing.assert_close(grad, expected)
    # Every valid token with an advantage is pushed its way, whatever its ratio.
    pushed = batch.mask & (batch.advantages.abs() > 1e-100)  # a subnormal Â / count underflows
    assert torch.all(torch.sign(grad[pushed]) == -torch.sign(batch.advantages[pushed]))


@given(batch=token_batches())
def test_unclipped_cispo_has_the_gradient_of_unclipped_ppo(
    ext: ModuleType, batch: TokenBatch
) -> None:
    # Ratios lie in [e^-1.5, e^1.5] here: neither clip range below is ever reached.
    config = PolicyLossConfig(clip_low=0.9, clip_high=1e9)
    _, cispo_grad = loss_grad("cispo", batch, config)
    _, ppo_grad = loss_grad("ppo", batch, config)
    torch.testing.assert_close(cispo_grad, ppo_grad)
    # Same gradient, different objective: CISPO's is −ρ Â log π, PPO's −ρ Â.
    fresh = attrs.evolve(batch, old_logprobs=batch.logprobs)
    _, cispo_fresh = loss_grad("cispo", fresh, PolicyLossConfig())
    _, vanilla = loss_grad("vanilla", fresh, PolicyLossConfig())
    torch.testing.assert_close(cispo_fresh, vanilla)


def test_cispo_keeps_the_gradient_ppo_clips_away(ext: ModuleType) -> None:
    # One token, ρ = 2, ε = 0.2 both sides.
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.2)
    logprobs = torch.tensor([[-1.0]])
    old = logprobs - torch.log(torch.tensor(2.0))
    mask = torch.ones(1, 1, dtype=torch.bool)
    grads = {}
    for advantage in (1.0, -1.0):
        batch = TokenBatch(
            logprobs=logprobs,
            old_logprobs=old,
            ref_logprobs=logprobs,
            advantages=torch.tensor([[advantage]]),
            token_rewards=torch.zeros(1, 1),
            values=torch.zeros(1, 1),
            old_values=torch.zeros(1, 1),
            returns=torch.zeros(1, 1),
            mask=mask,
        )
        for name in ("ppo", "cispo"):
            grads[name, advantage] = float(loss_grad(name, batch, config)[1])
    # Â = +1: PPO's clip is active (ρ > 1.2) and its gradient is 0; CISPO pushes with weight 1.2.
    assert grads["ppo", 1.0] == 0.0
    assert grads["cispo", 1.0] == pytest.approx(-1.2)
    # Â = −1: PPO's unclipped branch, gradient ρ = 2; CISPO's weight is capped at 1.2.
    assert grads["ppo", -1.0] == pytest.approx(2.0)
    assert grads["cispo", -1.0] == pytest.approx(1.2)
    out = POLICY_LOSSES.get("cispo")(
        PolicyLossBatch(logprobs, old, torch.tensor([[1.0]]), mask), config
    )
    assert float(out.metrics["clipfrac"]) == 1.0
    assert float(out.metrics["weight_mean"]) == pytest.approx(1.2)


def test_the_runtime_checker_catches_what_mypy_cannot(ext: ModuleType) -> None:
    from rlstack_typed_ext import cispo_policy_loss, pairwise_win_rate

    with pytest.raises(TypeCheckError, match=r"argument 'scores' has dtype int64; expected one"):
        pairwise_win_rate(torch.tensor([[1, 0, 1]]))
    with pytest.raises(TypeCheckError, match=r"argument 'scores' has shape \(4,\) \(1 dims\)"):
        pairwise_win_rate(torch.tensor([1.0, 0.0, 1.0, 1.0]))
    logprobs = torch.zeros(2, 5)
    with pytest.raises(TypeCheckError, match=r"argument 'advantages' has shape \(2, 4\): dim"):
        cispo_policy_loss(logprobs, logprobs, torch.zeros(2, 4), torch.ones(2, 5))


# ---------------------------------------------------------------------------
# mypy --strict on the package and on copies with one mistake each.

_ERROR = re.compile(r"^(?P<path>.+?):(?P<line>\d+): error: (?P<message>.+)  \[(?P<code>[a-z-]+)\]$")


class Expected(NamedTuple):
    file: str  # inside the package
    marker: str  # text of the line mypy must report (unique in the mutated file)
    code: str  # mypy's error code
    message: str  # a part of mypy's message


class Mistake(NamedTuple):
    file: str  # the file of the package it edits
    edits: list[tuple[str, str]]  # (old, new): each `old` occurs exactly once
    expected: list[Expected]  # empty: mypy passes it


MISTAKES = {
    "estimator returns a bare tensor, not the Advantages record": Mistake(
        "advantages.py",
        [("return Advantages(advantages=advantages, returns=advantages)", "return advantages")],
        [
            Expected(
                "advantages.py",
                "        return advantages",
                "return-value",
                'Incompatible return value type (got "Tensor", expected "Advantages")',
            )
        ],
    ),
    "loss returns a tuple, not the LossOutput record": Mistake(
        "losses.py",
        [("    return LossOutput(\n        loss,", "    return (\n        loss,")],
        [
            Expected(
                "losses.py",
                "    return (",
                "return-value",
                'Incompatible return value type (got "tuple[Tensor, dict[str, Tensor]]", '
                'expected "LossOutput")',
            )
        ],
    ),
    "estimator forgets the config parameter: registering it fails": Mistake(
        "advantages.py",
        [
            (
                "def __call__(self, batch: AdvantageBatch, config: AdvantageConfig)",
                "def __call__(self, batch: AdvantageBatch)",
            )
        ],
        [
            Expected(
                "__init__.py",
                "ADVANTAGES.register(",
                "call-overload",
                'No overload variant of "register" of "Registry" matches argument types '
                '"str", "WinRateEstimator", "bool"',
            )
        ],
    ),
    "loss renames a parameter of the PolicyLoss protocol: registering it fails": Mistake(
        "losses.py",
        [
            (
                "def cispo(batch: PolicyLossBatch, config: PolicyLossConfig)",
                "def cispo(batch: PolicyLossBatch, cfg: PolicyLossConfig)",
            ),
            ("= config.clip_range(", "= cfg.clip_range("),
            ("        config.agg,", "        cfg.agg,"),
        ],
        [
            Expected(
                "__init__.py",
                "POLICY_LOSSES.register(",
                "call-overload",
                'No overload variant of "register" of "Registry" matches argument types '
                '"str", "Callable[[PolicyLossBatch, PolicyLossConfig], LossOutput]", "bool"',
            )
        ],
    ),
    "estimator annotates a numpy array where rlcore passes a tensor": Mistake(
        "advantages.py",
        [
            ("import attrs\n", "import attrs\nimport numpy as np\n"),
            (
                ') -> Float[Tensor, "groups group_size"]:',
                ') -> Float[np.ndarray, "groups group_size"]:',
            ),
        ],
        [
            Expected(
                "advantages.py",
                "    return outcome.sum(dim=-1) / (size - 1)",
                "return-value",
                'Incompatible return value type (got "Tensor", expected "ndarray',
            ),
            Expected(
                "advantages.py",
                "advantages = broadcast_to_tokens(per_sequence, batch.mask)",
                "arg-type",
                'Argument 1 to "broadcast_to_tokens" has incompatible type "ndarray',
            ),
        ],
    ),
    # What mypy cannot see: jaxtyping's dtype and shape are invisible to it.
    "scores annotated Int instead of Float (a dtype)": Mistake(
        "advantages.py",
        [
            ("from jaxtyping import Float\n", "from jaxtyping import Float, Int\n"),
            (
                '    scores: Float[Tensor, "groups group_size"]',
                '    scores: Int[Tensor, "groups group_size"]',
            ),
        ],
        [],
    ),
    "win rate annotated one value per group (a shape)": Mistake(
        "advantages.py",
        [(') -> Float[Tensor, "groups group_size"]:', ') -> Float[Tensor, "groups"]:')],
        [],
    ),
}


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache of this module's own; a copy of the checkout's (what `make typecheck` analysed of
    torch and rlcore) when there is one. mypy checks every cached module against its source
    and options before it trusts it, so a copy only saves time."""
    cache = tmp_path_factory.mktemp("mypy") / "cache"
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", cache)
    return cache


def run_mypy(cache: Path, *packages: Path) -> tuple[int, str]:
    """``mypy --strict`` on ``packages``, with the example's own config (its pyproject.toml)."""
    stdout, stderr, status = mypy.api.run(
        [
            "--config-file",
            str(EXAMPLE / "pyproject.toml"),
            "--strict",
            "--cache-dir",
            str(cache),
            "--show-absolute-path",
            "--no-pretty",
            *map(str, packages),
        ]
    )
    return status, stdout + stderr


def test_the_example_package_is_mypy_strict_clean(mypy_cache: Path) -> None:
    status, output = run_mypy(mypy_cache, EXAMPLE / PACKAGE)
    assert status == 0, output
    assert "Success: no issues found in 3 source files" in output


class MistakenCopies(NamedTuple):
    packages: dict[str, Path]  # mistake -> its copy of the package
    errors: dict[str, dict[tuple[str, int, str], str]]  # mistake -> (file, line, code) -> message
    output: str


@pytest.fixture(scope="module")
def mistaken(tmp_path_factory: pytest.TempPathFactory, mypy_cache: Path) -> MistakenCopies:
    """One copy of the package per mistake, each under its own name; one mypy run for all."""
    root = tmp_path_factory.mktemp("mistakes")
    packages = {}
    for number, (mistake, (file, edits, _)) in enumerate(MISTAKES.items()):
        name = f"mistake_{number}"
        package = root / name
        shutil.copytree(EXAMPLE / PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
        for path in package.glob("*.py"):
            path.write_text(path.read_text().replace(PACKAGE, name))
        path = package / file
        text = path.read_text()
        for old, new in edits:
            assert text.count(old) == 1, f"{file} no longer has {old!r} exactly once"
            text = text.replace(old, new)
        path.write_text(text)
        packages[mistake] = package
    _, output = run_mypy(mypy_cache, *packages.values())
    by_package: dict[Path, dict[tuple[str, int, str], str]] = {p: {} for p in packages.values()}
    for line in output.splitlines():
        match = _ERROR.match(line)
        assert match or ": note: " in line or line.startswith("Found "), f"mypy said: {line}"
        if match:
            path = Path(match["path"])
            where = (path.name, int(match["line"]), match["code"])
            by_package[path.parent][where] = match["message"]
    errors = {mistake: by_package[package] for mistake, package in packages.items()}
    return MistakenCopies(packages, errors, output)


def line_of(path: Path, marker: str) -> int:
    lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line]
    assert len(lines) == 1, f"{path.name}: {marker!r} is on lines {lines}, expected one"
    return lines[0]


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_mypy_reports_the_mistake_where_it_is(mistake: str, mistaken: MistakenCopies) -> None:
    package = mistaken.packages[mistake]
    errors = mistaken.errors[mistake]
    expected = {
        (e.file, line_of(package / e.file, e.marker), e.code): e.message
        for e in MISTAKES[mistake].expected
    }
    if not expected:
        assert not errors, f"mypy now sees this mistake: update docs/extending.md\n{errors}"
        return
    assert set(errors) == set(expected), mistaken.output
    for where, message in expected.items():
        assert message in errors[where], f"{where}: {errors[where]}"


@pytest.mark.parametrize(
    ("mistake", "error"),
    [
        (
            "scores annotated Int instead of Float (a dtype)",
            r"pairwise_win_rate: argument 'scores' has dtype float32; expected one of: int",
        ),
        (
            "win rate annotated one value per group (a shape)",
            r"Type-check error whilst checking the return value of .*pairwise_win_rate",
        ),
    ],
)
def test_what_mypy_passes_the_runtime_checker_stops_at_the_first_call(
    mistake: str, error: str, mistaken: MistakenCopies, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"{mistaken.packages[mistake].name}_advantages"
    path = mistaken.packages[mistake] / "advantages.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    scores = torch.tensor([[1.0, 0.0, 0.0], [2.0, 3.0, 1.0]])
    mask = torch.ones(6, 1, dtype=torch.bool)
    batch = AdvantageBatch(scores.reshape(-1, 1), mask, group_size=3)
    with pytest.raises(TypeCheckError, match=error):
        module.WinRateEstimator()(batch, AdvantageConfig())
