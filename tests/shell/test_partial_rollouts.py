"""Partial rollouts (``rollout.partial_rollouts``): a generation interrupted by new weights.

`HFRolloutEngine.generate_partial` stops every row between two tokens when the
switch has weights waiting, applies them, and continues the unfinished rows.
What must hold, wherever the interruption falls (hypothesis draws it):

- the tokens before it are the uninterrupted generation's (same seed);
- each token is tagged with the version that sampled it, and its behaviour log-prob
  is that version's: a forward of the old weights over the whole response gives the
  old tokens' log-probs, one of the new weights the new tokens';
- a response that ended before it stays ended; ``min_new_tokens`` still holds after it;
- without an interruption it is `generate`, token for token.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from rlshell.engines.rollout.hf import HFRolloutEngine
from rlshell.models import get_model
from rlshell.rollout import SamplingParams
from rlshell.runners.validation import load_config
from rlshell.tokenizer import load_tokenizer, prepare_tokenizer, with_tokenizer_ids
from rlshell.workers.forward import policy_forward

TEMPERATURE = 0.8
BUDGET = 10


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> HFRolloutEngine:
    base = load_config(Path("configs/grpo.py"), [f"rollout.max_new_tokens={BUDGET}"])
    tokenizer_dir = prepare_tokenizer(base, tmp_path_factory.mktemp("run"))
    config = with_tokenizer_ids(base, tokenizer_dir)
    torch.manual_seed(0)
    model = get_model(config.actor.model)
    return HFRolloutEngine(model, load_tokenizer(tokenizer_dir), torch.device("cpu"))


@pytest.fixture(scope="module")
def versions(engine: HFRolloutEngine) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Version 0's weights and version 1's (each tensor moved by a quarter of its spread)."""
    old = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    new = {
        k: v
        + 0.25 * (v.float().std() if v.numel() > 1 else 1.0) * torch.randn(v.shape, generator=gen)
        if v.is_floating_point()
        else v.clone()
        for k, v in old.items()
    }
    return old, new


class _Switch:
    """Version 1's weights waiting from the ``at``-th token on (None: never); `apply` loads
    them into the engine's model."""

    def __init__(self, engine: HFRolloutEngine, new: dict[str, Tensor], at: int | None) -> None:
        self.engine, self.new, self.at = engine, new, at
        self.version = 0
        self.asked = 0

    def pending(self) -> bool:
        self.asked += 1
        return self.version == 0 and self.at is not None and self.asked >= self.at

    def apply(self) -> None:
        self.engine.model.load_state_dict(self.new)
        self.version += 1


def _logprobs_of(engine: HFRolloutEngine, weights: dict[str, Tensor], batch: object) -> Tensor:
    engine.model.load_state_dict(weights)
    logprobs, _ = policy_forward(engine.model, batch, TEMPERATURE, chunk_size=64)  # type: ignore[arg-type]
    return logprobs


PROMPTS = ["1+2=", "13+40=", "7+7="]


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(at=st.integers(1, BUDGET - 1), seed=st.integers(0, 2**16), n=st.integers(1, 3))
def test_an_interrupted_generation_keeps_its_prefix_and_tags_each_token_with_its_sampler(
    engine: HFRolloutEngine,
    versions: tuple[dict[str, Tensor], dict[str, Tensor]],
    at: int,
    seed: int,
    n: int,
) -> None:
    old, new = versions
    params = SamplingParams(n=n, temperature=TEMPERATURE, max_new_tokens=BUDGET)
    engine.model.load_state_dict(old)
    whole = engine.generate(PROMPTS, params, seed=seed)
    switch = _Switch(engine, new, at)
    batch, tags = engine.generate_partial(PROMPTS, params, seed, switch)
    assert switch.version == (1 if whole.response_ids.shape[1] > at else 0)
    mask = batch.response_mask
    # Before the switch: the uninterrupted generation's tokens, by version 0.
    prefix = min(at, whole.response_ids.shape[1])
    assert torch.equal(batch.response_ids[:, :prefix], whole.response_ids[:, :prefix])
    assert torch.equal(mask[:, :prefix], whole.response_mask[:, :prefix])
    assert torch.all(tags[:, :prefix][mask[:, :prefix]] == 0)
    # After it: version 1 on every token still in a response; nothing past a response's end.
    assert torch.all(tags[:, prefix:][mask[:, prefix:]] == 1)
    assert torch.all(tags[~mask] == -1)
    ended = ~mask[:, prefix - 1] | (whole.response_ids[:, prefix - 1] == engine.eos_id)
    assert not mask[ended, prefix:].any()  # a response that had ended stays ended
    # Each token's behaviour log-prob is its sampler's.
    for version, weights in ((0, old), (1, new)):
        mine = tags == version
        if mine.any():
            torch.testing.assert_close(
                batch.logprobs[mine], _logprobs_of(engine, weights, batch)[mine], atol=2e-5, rtol=0
            )
    engine.model.load_state_dict(old)


def test_without_an_interruption_it_is_generate_token_for_token(
    engine: HFRolloutEngine, versions: tuple[dict[str, Tensor], dict[str, Tensor]]
) -> None:
    old, new = versions
    engine.model.load_state_dict(old)
    params = SamplingParams(n=4, temperature=TEMPERATURE, max_new_tokens=BUDGET)
    whole = engine.generate(PROMPTS, params, seed=3)
    batch, tags = engine.generate_partial(PROMPTS, params, 3, _Switch(engine, new, None))
    for name in ("response_ids", "response_mask", "logprobs"):
        assert torch.equal(getattr(batch, name), getattr(whole, name)), name
    assert batch.response_texts == whole.response_texts
    assert torch.equal(tags, torch.where(whole.response_mask, 0, -1))


def test_min_new_tokens_still_holds_after_an_interruption(
    engine: HFRolloutEngine, versions: tuple[dict[str, Tensor], dict[str, Tensor]]
) -> None:
    old, new = versions
    engine.model.load_state_dict(old)
    params = SamplingParams(
        n=4, temperature=TEMPERATURE, max_new_tokens=BUDGET, min_new_tokens=BUDGET
    )
    batch, tags = engine.generate_partial(PROMPTS, params, 5, _Switch(engine, new, 3))
    assert batch.response_ids.shape[1] == BUDGET
    assert torch.all(batch.response_mask.sum(dim=1) == BUDGET)  # no EOS before the budget
    assert torch.equal(tags[:, :3], torch.zeros(12, 3, dtype=torch.long))
    assert torch.all(tags[:, 3:] == 1)
    engine.model.load_state_dict(old)
