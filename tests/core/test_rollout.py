"""Rollout transforms: masks, positions, reward placement, DAPO tricks, packing, micro-batches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from jaxtyping import TypeCheckError

from rlcore.batching import balanced_micro_batches, group_mini_batches
from rlcore.losses import kl_estimate
from rlcore.packing import pack_sequences, packed_response_predictors, unpack_sequences
from rlcore.shaping import (
    adaptive_kl_coef,
    combine_rewards,
    filter_informative_groups,
    kl_penalized_rewards,
    length_penalty,
    overlong_penalty,
)
from rlcore.testing import TokenBatch, group_scores, masks, token_batches
from rlcore.tokens import broadcast_to_tokens, place_on_last_token, position_ids, response_mask

# --- response_mask --------------------------------------------------------------------------


@given(
    tokens=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=10), min_size=1, max_size=4)
    .filter(lambda rows: len({len(r) for r in rows}) == 1)
    .map(torch.tensor),
    eos=st.integers(0, 5),
)
def test_response_mask_is_valid_up_to_and_including_the_first_eos(
    tokens: torch.Tensor, eos: int
) -> None:
    mask = response_mask(tokens, eos)
    for row, row_mask in zip(tokens.tolist(), mask.tolist(), strict=True):
        end = row.index(eos) + 1 if eos in row else len(row)
        assert row_mask == [True] * end + [False] * (len(row) - end)


def test_response_mask_hand_example_with_two_end_tokens() -> None:
    tokens = torch.tensor([[5, 6, 2, 9, 9], [5, 3, 6, 6, 3], [1, 1, 1, 1, 1]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(response_mask(tokens, [2, 3]), expected)


# --- position_ids ---------------------------------------------------------------------------


@given(mask=st.integers(1, 4).flatmap(lambda b: masks((b, 7))))
def test_position_ids_count_valid_tokens_before(mask: torch.Tensor) -> None:
    positions = position_ids(mask)
    for row, row_mask in zip(positions.tolist(), mask.tolist(), strict=True):
        seen = 0
        for position, valid in zip(row, row_mask, strict=True):
            if valid:
                assert position == seen
                seen += 1


def test_position_ids_with_left_padding_start_at_zero() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


# --- reward placement ------------------------------------------------------------------------


@given(mask=st.integers(1, 4).flatmap(lambda b: masks((b, 6), allow_empty_rows=False)))
def test_place_on_last_token_puts_each_score_on_the_last_valid_token(mask: torch.Tensor) -> None:
    scores = torch.arange(1, mask.shape[0] + 1, dtype=torch.float64)
    rewards = place_on_last_token(scores, mask)
    torch.testing.assert_close(rewards.sum(-1), scores)
    for row, row_mask, score in zip(rewards, mask, scores, strict=True):
        last = int(torch.nonzero(row_mask).max())
        assert row[last] == score
        assert torch.count_nonzero(row) == 1


def test_place_on_last_token_refuses_rows_without_tokens() -> None:
    with pytest.raises(ValueError, match=r"no valid token \[1\]"):
        place_on_last_token(torch.ones(2), torch.tensor([[1, 0], [0, 0]], dtype=torch.bool))


def test_broadcast_to_tokens_hand_example() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert out.tolist() == [[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]


# --- DAPO: overlong penalty and dynamic sampling ----------------------------------------------


# --- the KL penalty in the reward ----------------------------------------------------------


@given(batch=token_batches(), coef=st.floats(0.0, 2.0))
def test_the_k1_penalty_of_a_row_sums_to_coef_times_its_log_ratio(
    batch: TokenBatch, coef: float
) -> None:
    rewards, kl = kl_penalized_rewards(
        batch.token_rewards, batch.logprobs, batch.ref_logprobs, batch.mask, coef, "k1"
    )
    log_ratio = torch.where(batch.mask, batch.logprobs - batch.ref_logprobs, 0.0)
    torch.testing.assert_close(kl, log_ratio)
    # Padding keeps its reward; the row's total loses β·Σ log π/π_ref over its tokens.
    assert torch.equal(rewards[~batch.mask], batch.token_rewards[~batch.mask])
    torch.testing.assert_close(
        rewards.sum(-1), batch.token_rewards.sum(-1) - coef * log_ratio.sum(-1)
    )


@given(
    batch=token_batches(),
    coef=st.floats(0.0, 2.0),
    kind=st.sampled_from(["k1", "k2", "k3", "abs", "kl", "mse", "low_var_kl"]),
)
def test_the_penalty_is_the_named_estimate_and_vanishes_on_the_reference(
    batch: TokenBatch, coef: float, kind: str
) -> None:
    rewards, kl = kl_penalized_rewards(
        batch.token_rewards,
        batch.logprobs,
        batch.ref_logprobs,
        batch.mask,
        coef,
        kind,  # type: ignore[arg-type]
    )
    expected = torch.where(batch.mask, kl_estimate(batch.logprobs, batch.ref_logprobs, kind), 0.0)  # type: ignore[arg-type]
    torch.testing.assert_close(kl, expected)
    torch.testing.assert_close(rewards, batch.token_rewards - coef * expected)
    if kind not in ("k1", "kl"):  # the other estimates are ≥ 0: the reward only loses
        assert torch.all(rewards <= batch.token_rewards + 1e-12)
    # A policy equal to its reference pays nothing, whatever the kind and coefficient.
    same, zero = kl_penalized_rewards(
        batch.token_rewards,
        batch.logprobs,
        batch.logprobs,
        batch.mask,
        coef,
        kind,  # type: ignore[arg-type]
    )
    assert torch.equal(same, batch.token_rewards)
    assert torch.equal(zero, torch.zeros_like(zero))


def test_the_penalty_refuses_straight_through_kinds_and_a_negative_coefficient() -> None:
    rewards = torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"'k3\+' is straight-through.*'k3'"):
        kl_penalized_rewards(rewards, rewards, rewards, mask, 0.1, "k3+")
    with pytest.raises(ValueError, match=r"at least 0, got -0\.1"):
        kl_penalized_rewards(rewards, rewards, rewards, mask, -0.1)


@given(
    coef=st.floats(1e-4, 1.0),
    kl=st.floats(0.0, 10.0),
    target=st.floats(1e-3, 5.0),
    horizon=st.integers(1, 10_000),
    samples=st.integers(1, 512),
)
def test_the_adaptive_coefficient_moves_towards_the_target_by_a_bounded_factor(
    coef: float, kl: float, target: float, horizon: int, samples: int
) -> None:
    if samples >= 5 * horizon:
        with pytest.raises(ValueError, match="lengthen the horizon"):
            adaptive_kl_coef(coef, kl, target, horizon, samples)
        return
    new = adaptive_kl_coef(coef, kl, target, horizon, samples)
    step = 0.2 * samples / horizon
    assert new > 0
    assert coef * (1 - step) - 1e-12 <= new <= coef * (1 + step) + 1e-12
    if kl > target:
        assert new >= coef  # drifting too far: a stronger pull back
    elif kl < target:
        assert new <= coef
    assert adaptive_kl_coef(coef, target, target, horizon, samples) == coef


def test_the_adaptive_coefficient_follows_ziegler_et_al() -> None:
    # e = clip(12/6 − 1, ±0.2) = 0.2 and n/H = 256/10000: β·(1 + 0.2·0.0256).
    assert adaptive_kl_coef(0.1, 12.0, 6.0, 10_000, 256) == pytest.approx(0.1 * (1 + 0.2 * 0.0256))
    # e = 5/6 − 1 = −1/6 inside the clip.
    assert adaptive_kl_coef(0.1, 5.0, 6.0, 100, 10) == pytest.approx(0.1 * (1 - 1 / 60))
    with pytest.raises(ValueError, match="target > 0"):
        adaptive_kl_coef(0.1, 1.0, 0.0, 100, 10)


def test_overlong_penalty_follows_dapo_piecewise_definition() -> None:
    lengths = torch.tensor([0, 12, 16, 17, 18, 20, 21, 100])
    penalty = overlong_penalty(lengths, max_length=20, buffer_length=4)
    expected = torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    torch.testing.assert_close(penalty, expected)
    torch.testing.assert_close(overlong_penalty(lengths, 20, 4, penalty_factor=0.5), expected * 0.5)


@given(st.lists(st.integers(0, 64), min_size=1, max_size=20), st.integers(1, 32))
def test_overlong_penalty_is_monotone_and_bounded(lengths: list[int], buffer: int) -> None:
    ordered = torch.tensor(sorted(lengths))
    penalty = overlong_penalty(ordered, max_length=32, buffer_length=buffer)
    assert torch.all(penalty <= 0)
    assert torch.all(penalty >= -1)
    assert torch.all(penalty[1:] <= penalty[:-1])


def test_overlong_penalty_rejects_a_buffer_longer_than_the_limit() -> None:
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(torch.tensor([1]), max_length=4, buffer_length=5)


@given(scores=group_scores())
def test_informative_groups_are_exactly_those_with_spread(scores: torch.Tensor) -> None:
    keep = filter_informative_groups(scores)
    for group, kept in zip(scores, keep, strict=True):
        assert bool(kept) == (len(set(group.tolist())) > 1)


# --- Kimi k1.5's length penalty ---------------------------------------------------------------


@st.composite
def length_groups(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Response lengths ``[groups, group_size]`` (ties common) and which responses are correct."""
    groups, size = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    cells = st.lists(st.integers(1, 12), min_size=size, max_size=size)
    lengths = torch.tensor(draw(st.lists(cells, min_size=groups, max_size=groups)))
    flags = st.lists(st.booleans(), min_size=size, max_size=size)
    correct = torch.tensor(draw(st.lists(flags, min_size=groups, max_size=groups)))
    return lengths, correct


@given(length_groups())
def test_length_penalty_is_bounded_never_rewards_a_wrong_answer_and_ignores_one_length(
    case: tuple[torch.Tensor, torch.Tensor],
) -> None:
    lengths, correct = case
    penalty = length_penalty(lengths, correct)
    assert torch.all(penalty.abs() <= 0.5)
    assert torch.all(penalty[~correct] <= 0)
    for group_lengths, group_penalty, group_correct in zip(lengths, penalty, correct, strict=True):
        if group_lengths.min() == group_lengths.max():
            assert torch.all(group_penalty == 0)
            continue
        longest = group_lengths == group_lengths.max()
        assert torch.all(group_penalty[longest] == -0.5)
        shortest_correct = (group_lengths == group_lengths.min()) & group_correct
        assert torch.all(group_penalty[shortest_correct] == 0.5)


@given(length_groups())
def test_length_penalty_falls_with_length_and_never_favours_a_wrong_answer(
    case: tuple[torch.Tensor, torch.Tensor],
) -> None:
    lengths, correct = case
    penalty = length_penalty(lengths, correct)
    flipped = length_penalty(lengths, ~correct)
    assert torch.all(torch.where(correct, penalty >= flipped, penalty <= flipped))
    # Among responses that are all right (or all wrong), a longer one never scores more.
    for flag in (True, False):
        same = length_penalty(lengths, torch.full_like(correct, flag))
        ordered = same.gather(-1, torch.argsort(lengths, dim=-1))
        assert torch.all(ordered[:, 1:] <= ordered[:, :-1])


@given(length_groups(), st.integers(1, 5), st.integers(0, 100))
def test_length_penalty_is_unchanged_by_shifting_or_scaling_a_groups_lengths(
    case: tuple[torch.Tensor, torch.Tensor], scale: int, shift: int
) -> None:
    lengths, correct = case
    torch.testing.assert_close(
        length_penalty(lengths * scale + shift, correct), length_penalty(lengths, correct)
    )


def test_length_penalty_hand_example() -> None:
    lengths = torch.tensor([[2, 4, 6, 10], [3, 3, 3, 3]])
    correct = torch.tensor([[True, True, False, False], [True, False, True, False]])
    # λ = 0.5 − (L − 2) / 8 in the first group: 0.5, 0.25, 0.0, −0.5.
    expected = torch.tensor([[0.5, 0.25, 0.0, -0.5], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(length_penalty(lengths, correct), expected)
    # Wrong instead: no gain for being short.
    torch.testing.assert_close(
        length_penalty(lengths[:1], torch.zeros(1, 4, dtype=torch.bool)),
        torch.tensor([[0.0, 0.0, 0.0, -0.5]]),
    )


def test_length_penalty_checks_its_shapes() -> None:
    with pytest.raises(TypeCheckError):
        length_penalty(torch.tensor([[1, 2]]), torch.tensor([[True, False, True]]))


# --- the weighted total of several rewards ----------------------------------------------------


@st.composite
def reward_scores(draw: st.DrawFn) -> torch.Tensor:
    """Scores ``[rewards, batch]`` of a few reward functions on one batch."""
    rewards, batch = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    value = st.floats(-10, 10, allow_nan=False, width=32)
    rows = st.lists(st.lists(value, min_size=batch, max_size=batch), min_size=rewards)
    return torch.tensor(draw(rows.filter(lambda r: len(r) == rewards)), dtype=torch.float64)


@given(reward_scores(), st.data())
def test_combined_rewards_are_linear_in_the_weights_and_a_unit_weight_picks_one(
    scores: torch.Tensor, data: st.DataObject
) -> None:
    count, f64 = scores.shape[0], torch.float64
    weight = st.floats(-3, 3, allow_nan=False)
    first = torch.tensor(data.draw(st.lists(weight, min_size=count, max_size=count)), dtype=f64)
    second = torch.tensor(data.draw(st.lists(weight, min_size=count, max_size=count)), dtype=f64)
    factor = data.draw(weight)
    torch.testing.assert_close(
        combine_rewards(scores, factor * first + second),
        factor * combine_rewards(scores, first) + combine_rewards(scores, second),
    )
    picked = data.draw(st.integers(0, count - 1))
    unit = torch.zeros(count, dtype=torch.float64)
    unit[picked] = 1.0
    assert torch.equal(combine_rewards(scores, unit), scores[picked])


def test_combined_rewards_hand_example() -> None:
    scores = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.5, -0.5, 0.0]])
    total = combine_rewards(scores, torch.tensor([1.0, 0.2, 0.1]))
    torch.testing.assert_close(total, torch.tensor([1.25, 0.15, 1.0]))
    with pytest.raises(TypeCheckError):
        combine_rewards(scores, torch.tensor([1.0, 0.2]))


# --- packing --------------------------------------------------------------------------------


@given(
    mask=st.integers(1, 4).flatmap(lambda b: masks((b, 6))),
    features=st.sampled_from([(), (3,)]),
)
def test_pack_then_unpack_round_trips(mask: torch.Tensor, features: tuple[int, ...]) -> None:
    values = torch.randn(*mask.shape, *features, dtype=torch.float64)
    packed = pack_sequences(values, mask)
    lengths = mask.sum(-1)
    assert packed.cu_seqlens.dtype == torch.int32
    assert packed.cu_seqlens.tolist() == [0, *torch.cumsum(lengths, 0).tolist()]
    assert packed.max_seqlen == int(lengths.max())
    for i in range(mask.shape[0]):
        start, end = packed.cu_seqlens[i], packed.cu_seqlens[i + 1]
        torch.testing.assert_close(packed.values[start:end], values[i][mask[i]])
        assert packed.position_ids[start:end].tolist() == list(range(int(end - start)))
    restored = unpack_sequences(packed.values, mask)
    expected = torch.where(mask.reshape(*mask.shape, *[1] * len(features)), values, 0.0)
    torch.testing.assert_close(restored, expected)


def test_pack_keeps_integer_tokens_and_unpack_checks_the_count() -> None:
    tokens = torch.tensor([[7, 8, 0], [9, 0, 0]])
    mask = tokens != 0
    packed = pack_sequences(tokens, mask)
    assert packed.values.tolist() == [7, 8, 9]
    assert torch.equal(unpack_sequences(packed.values, mask), tokens)
    with pytest.raises(ValueError, match="packed has 2 tokens but mask has 3"):
        unpack_sequences(packed.values[:2], mask)


@given(
    prompt_mask=st.integers(1, 4).flatmap(lambda b: masks((b, 5), allow_empty_rows=False)),
    data=st.data(),
)
def test_the_packed_predictors_sit_one_before_each_response_token_in_its_own_sequence(
    prompt_mask: torch.Tensor, data: st.DataObject
) -> None:
    # Any masks (holes too): packing keeps the valid tokens in order, whatever the layout.
    response_mask = data.draw(masks((prompt_mask.shape[0], 4)))
    rows = prompt_mask.shape[0]
    prompt_ids = torch.arange(rows * 5).view(rows, 5)
    response_ids = 1000 + torch.arange(rows * 4).view(rows, 4)
    packed = pack_sequences(
        torch.cat([prompt_ids, response_ids], -1), torch.cat([prompt_mask, response_mask], -1)
    )
    predictors = packed_response_predictors(prompt_mask, response_mask)
    assert predictors.dtype == torch.long
    # The next packed token is each response token, in unpack_sequences' (row-major) order.
    assert packed.values[predictors + 1].tolist() == response_ids[response_mask].tolist()
    # A predictor is in the same sequence as the token it predicts.
    sequence = torch.searchsorted(packed.cu_seqlens, predictors, right=True)
    after = torch.searchsorted(packed.cu_seqlens, predictors + 1, right=True)
    assert torch.equal(sequence, after)


@given(
    prompt_lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    data=st.data(),
)
def test_the_packed_predictors_are_the_padded_forwards_columns(
    prompt_lengths: list[int], data: st.DataObject
) -> None:
    # Left-padded prompts, right-padded responses: the padded forward reads the logits of
    # column width − 1 + j for response token j; packing that column index finds the same.
    width, span = 5, 4
    prompt_mask = torch.arange(width) >= width - torch.tensor(prompt_lengths).unsqueeze(-1)
    response_mask = data.draw(masks((len(prompt_lengths), span), contiguous=True))
    columns = torch.arange(width + span).expand(len(prompt_lengths), -1)
    packed = pack_sequences(columns, torch.cat([prompt_mask, response_mask], -1))
    predictors = packed_response_predictors(prompt_mask, response_mask)
    padded = (width - 1 + torch.arange(span)).expand(len(prompt_lengths), -1)
    assert packed.values[predictors].tolist() == padded[response_mask].tolist()


def test_the_packed_predictors_need_a_prompt_token_before_a_response() -> None:
    prompt_mask = torch.tensor([[True, True], [False, False], [False, False]])
    response_mask = torch.tensor([[True], [True], [False]])
    with pytest.raises(ValueError, match=r"rows \[1\] have response tokens but no prompt token"):
        packed_response_predictors(prompt_mask, response_mask)
    assert packed_response_predictors(prompt_mask[[0, 2]], response_mask[[0, 2]]).tolist() == [1]


# --- balanced micro-batches ---------------------------------------------------------------------


@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=40),
    budget=st.integers(50, 200),
    minimum=st.integers(1, 4),
)
def test_micro_batches_partition_the_batch_within_budget(
    lengths: list[int], budget: int, minimum: int
) -> None:
    if len(lengths) < minimum:
        with pytest.raises(ValueError, match="non-empty micro-batches"):
            balanced_micro_batches(lengths, budget, minimum)
        return
    batches = balanced_micro_batches(lengths, budget, minimum)
    flat = sorted(i for batch in batches for i in batch)
    assert flat == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in batch) for batch in batches]
    assert all(load <= budget for load in loads)
    assert all(batch == sorted(batch) and batch for batch in batches)
    assert len(batches) >= max(minimum, -(-sum(lengths) // budget))
    # Longest-first greedy balance: loads differ by at most the longest sequence.
    assert max(loads) - min(loads) <= max(lengths)


def test_micro_batches_use_the_fewest_that_fit_on_an_easy_case() -> None:
    batches = balanced_micro_batches(torch.tensor([4, 4, 4, 4, 3, 3, 3, 3]), max_tokens=14)
    assert len(batches) == 2
    assert [sum([4, 4, 4, 4, 3, 3, 3, 3][i] for i in b) for b in batches] == [14, 14]


def test_micro_batches_reject_a_sequence_over_budget() -> None:
    with pytest.raises(ValueError, match="sequence 1 has 9 tokens, more than max_tokens=8"):
        balanced_micro_batches([3, 9], max_tokens=8)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        balanced_micro_batches([3], max_tokens=0)


# --- shapes ---------------------------------------------------------------------------------------


def test_wrong_shapes_name_the_argument_and_dimension() -> None:
    with pytest.raises(TypeCheckError, match=r"argument 'mask' has shape \(2, 4\).*'batch' is 2"):
        place_on_last_token(torch.ones(3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeCheckError, match=r"argument 'mask'.*dimension 'batch' is 3"):
        broadcast_to_tokens(torch.ones(2), torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeCheckError, match=r"argument 'tokens'.*dtype float32"):
        response_mask(torch.ones(2, 3), eos_id=1)


# --- group_mini_batches ---------------------------------------------------------------------


@given(
    groups=st.integers(1, 12),
    group_size=st.integers(1, 5),
    per_mini=st.integers(1, 12),
    seed=st.none() | st.integers(0, 2**31 - 1),
)
def test_mini_batches_partition_the_rows_into_equal_sets_of_whole_groups(
    groups: int, group_size: int, per_mini: int, seed: int | None
) -> None:
    rows = groups * group_size
    if groups % per_mini:
        with pytest.raises(ValueError, match="do not split into mini-batches"):
            group_mini_batches(rows, group_size, per_mini, seed)
        return
    batches = group_mini_batches(rows, group_size, per_mini, seed)
    assert sorted(row for batch in batches for row in batch) == list(range(rows))
    assert {len(batch) for batch in batches} == {per_mini * group_size}
    for batch in batches:
        for start in range(0, len(batch), group_size):
            chunk = batch[start : start + group_size]
            assert chunk[0] % group_size == 0
            assert chunk == list(range(chunk[0], chunk[0] + group_size))
    if seed is None:
        assert [row for batch in batches for row in batch] == list(range(rows))
    assert batches == group_mini_batches(rows, group_size, per_mini, seed)  # deterministic


def test_mini_batches_shuffle_groups_with_the_seed_and_refuse_partial_groups() -> None:
    splits = {str(group_mini_batches(32, 2, 4, seed)) for seed in range(5)}
    assert len(splits) > 1
    with pytest.raises(ValueError, match="7 rows are not whole groups of 2"):
        group_mini_batches(7, 2, 1)
