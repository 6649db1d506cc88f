"""Weight sync: both encodings round-trip bit for bit, properties first, then hand-made cases.

Tensors are made from random bytes, so floats include NaNs with any payload,
infinities, subnormals and both zeros; "equal" here always means equal bit
patterns, compared as bytes (not through the integer views the module uses).
"""

from __future__ import annotations

import json
import math
import pickle
import re
from collections.abc import Iterator

import cattrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import Tensor

from rlshell.sync.codec import (
    ALIGNMENT,
    BYTES_PER_MB,
    MIN_BUCKET_BYTES,
    PATCH_BLOCK,
    Bucket,
    BucketReceiver,
    FlatBuckets,
    Patch,
    PatchEncoder,
    PatchEntry,
    SyncCoverage,
    TensorPiece,
    WeightSyncError,
    apply_bucket,
    apply_patch,
    bucket_bytes_for,
    decode_bucket,
    encode_entry,
    encode_patch,
    iter_buckets,
    plan_buckets,
    sync_coverage,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]
SPECIALS = [float("nan"), -0.0, 0.0, float("inf"), float("-inf"), 1.0]
# Same-width integers, to build test data bit for bit.
INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# ---------------------------------------------------------------------------
# Helpers and strategies


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> Tensor:
    """Random bit patterns of ``dtype`` (0 or 1 for bool)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    numel = math.prod(shape)
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).reshape(shape)


def as_bytes(tensor: Tensor) -> Tensor:
    return tensor.reshape(-1).view(torch.uint8).reshape(tensor.numel(), tensor.element_size())


def bitwise_equal(a: Tensor, b: Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(as_bytes(a), as_bytes(b))


def changed_positions(before: Tensor, after: Tensor) -> Tensor:
    """Flat indices where the bytes of ``before`` and ``after`` differ (int64)."""
    return torch.nonzero((as_bytes(before) != as_bytes(after)).any(dim=1)).view(-1)


def zeros_like_all(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: torch.zeros_like(tensor) for name, tensor in tensors.items()}


def clone_all(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: tensor.clone() for name, tensor in tensors.items()}


def total_bytes(tensors: dict[str, Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())


seeds = st.integers(0, 2**31 - 1)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
names = st.from_regex(r"[a-z]{1,3}(\.[a-z0-9]{1,3}){0,2}", fullmatch=True)


@st.composite
def tensor_dicts(draw: st.DrawFn, max_size: int = 6) -> dict[str, Tensor]:
    """Up to ``max_size`` named tensors of random shapes (0-d and empty included) and dtypes."""
    keys = draw(st.lists(names, max_size=max_size, unique=True))
    return {
        key: random_tensor(draw(shapes), draw(st.sampled_from(DTYPES)), draw(seeds)) for key in keys
    }


def perturbed(before: Tensor, fraction: float, seed: int) -> Tensor:
    """``before`` with about ``fraction`` of its elements replaced by random bits or specials."""
    generator = torch.Generator().manual_seed(seed)
    flat = before.reshape(-1)
    where = torch.rand(flat.shape, generator=generator) < fraction
    replacement = random_tensor(tuple(flat.shape), before.dtype, seed + 1)
    if before.dtype.is_floating_point:
        specials = torch.tensor(SPECIALS, dtype=before.dtype)
        picks = torch.randint(0, len(SPECIALS), flat.shape, generator=generator)
        use_special = torch.rand(flat.shape, generator=generator) < 0.5
        replacement = torch.where(use_special, specials[picks], replacement)
    int_dtype = INT_OF_SIZE[before.element_size()]
    bits = flat.view(int_dtype).clone()
    bits[where] = replacement.view(int_dtype)[where]
    return bits.view(before.dtype).reshape(before.shape)


@st.composite
def snapshot_and_current(draw: st.DrawFn) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """A snapshot and a current state in which each tensor changed at random positions."""
    snapshot = draw(tensor_dicts())
    current = {
        key: perturbed(tensor, draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])), draw(seeds))
        for key, tensor in snapshot.items()
    }
    return snapshot, current


class CountingSource:
    """Named tensors as a generator that records how many it has handed out."""

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.tensors = tensors
        self.pulled = 0

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        for item in self.tensors.items():
            self.pulled += 1
            yield item


# ---------------------------------------------------------------------------
# Bucket mode: properties


@given(tensor_dicts(), st.integers(MIN_BUCKET_BYTES, 1200))
def test_buckets_round_trip_bitwise(source: dict[str, Tensor], bucket_bytes: int) -> None:
    targets = zeros_like_all(source)
    receiver = BucketReceiver(targets)
    buckets = list(iter_buckets(source.items(), bucket_bytes))
    for bucket in buckets:
        receiver.apply(bucket)
    assert receiver.bytes_applied == total_bytes(source)
    assert receiver.finish() == total_bytes(source)
    for name, tensor in source.items():
        assert bitwise_equal(targets[name], tensor), name
    assert [bucket.index for bucket in buckets] == list(range(len(buckets)))
    for bucket in buckets:
        assert bucket.nbytes <= bucket_bytes
        assert bucket.data.dtype == torch.uint8
        assert bucket.data.ndim == 1
        for piece in bucket.pieces:
            assert piece.numel == 0 or piece.byte_offset % ALIGNMENT == 0
            assert piece.byte_offset + piece.nbytes <= bucket.nbytes


@given(tensor_dicts(), st.integers(MIN_BUCKET_BYTES, 1200))
def test_pieces_are_consecutive_runs_in_order(source: dict[str, Tensor], bucket_bytes: int) -> None:
    """Tensors arrive in order, each as consecutive runs from element 0, split at full buckets."""
    pieces = [
        piece for bucket in iter_buckets(source.items(), bucket_bytes) for piece in bucket.pieces
    ]
    assert list(dict.fromkeys(piece.name for piece in pieces)) == list(source)
    for name, tensor in source.items():
        own = [piece for piece in pieces if piece.name == name]
        starts = [piece.element_offset for piece in own]
        ends = [piece.element_offset + piece.numel for piece in own]
        assert starts == [0, *ends[:-1]]
        assert ends[-1] == tensor.numel()
        assert all(piece.shape == tuple(tensor.shape) for piece in own)
        assert len(own) == 1 or all(piece.numel > 0 for piece in own)


@given(tensor_dicts(), st.integers(MIN_BUCKET_BYTES, 1200))
def test_decode_yields_the_source_elements(source: dict[str, Tensor], bucket_bytes: int) -> None:
    for bucket in iter_buckets(source.items(), bucket_bytes):
        for piece, values in decode_bucket(bucket):
            flat = source[piece.name].reshape(-1)
            expected = flat[piece.element_offset : piece.element_offset + piece.numel]
            assert bitwise_equal(values, expected)


def test_iter_buckets_pulls_tensors_lazily() -> None:
    """Two 64-byte tensors fill a 128-byte bucket: each bucket pulls exactly its own two."""
    source = CountingSource({f"w{i}": torch.full((16,), float(i)) for i in range(8)})
    buckets = iter_buckets(source, bucket_bytes=128)
    assert source.pulled == 0
    for index in range(4):
        bucket = next(buckets)
        assert bucket.index == index
        assert source.pulled == 2 * (index + 1)
        assert [piece.name for piece in bucket.pieces] == [f"w{2 * index}", f"w{2 * index + 1}"]
    assert next(buckets, None) is None


def test_a_large_tensor_is_split_across_buckets() -> None:
    weight = torch.arange(100, dtype=torch.float32)
    buckets = list(iter_buckets([("w", weight)], bucket_bytes=128))
    assert [bucket.nbytes for bucket in buckets] == [128, 128, 128, 16]
    pieces = [bucket.pieces[0] for bucket in buckets]
    assert [(piece.element_offset, piece.numel) for piece in pieces] == [
        (0, 32),
        (32, 32),
        (64, 32),
        (96, 4),
    ]
    assert all(piece.byte_offset == 0 for piece in pieces)


def test_pieces_of_mixed_dtypes_start_aligned() -> None:
    """A 3-byte bool tensor, then float32 and float64: each starts at a multiple of 16."""
    tensors = {
        "mask": torch.tensor([True, False, True]),
        "w": torch.tensor([1.5, -2.0]),
        "d": torch.tensor([3.0], dtype=torch.float64),
    }
    (bucket,) = iter_buckets(tensors.items(), bucket_bytes=64)
    assert [(piece.name, piece.byte_offset, piece.nbytes) for piece in bucket.pieces] == [
        ("mask", 0, 3),
        ("w", 16, 8),
        ("d", 32, 8),
    ]
    assert bucket.nbytes == 40
    decoded = {piece.name: values for piece, values in decode_bucket(bucket)}
    assert decoded["w"].dtype == torch.float32
    assert decoded["w"].tolist() == [1.5, -2.0]
    assert decoded["d"].tolist() == [3.0]


def test_a_tensor_that_does_not_fit_the_rest_of_a_bucket_continues_in_the_next() -> None:
    """40 bytes of room left after alignment hold 5 of the float64 tensor's 8 elements."""
    tensors = {"b": torch.ones(10, dtype=torch.bool), "d": torch.arange(8, dtype=torch.float64)}
    first, second = iter_buckets(tensors.items(), bucket_bytes=56)
    assert [(p.name, p.element_offset, p.numel) for p in first.pieces] == [
        ("b", 0, 10),
        ("d", 0, 5),
    ]
    assert [(p.name, p.element_offset, p.numel) for p in second.pieces] == [("d", 5, 3)]


def test_zero_d_empty_and_non_contiguous_tensors() -> None:
    source = {
        "scalar": torch.tensor(2.5, dtype=torch.bfloat16),
        "empty": torch.empty(0, 3),
        "transposed": torch.arange(6, dtype=torch.int64).reshape(2, 3).t(),
    }
    buckets = list(iter_buckets(source.items(), bucket_bytes=MIN_BUCKET_BYTES))
    empty_pieces = [p for b in buckets for p in b.pieces if p.name == "empty"]
    assert [(p.shape, p.numel) for p in empty_pieces] == [((0, 3), 0)]
    targets = zeros_like_all(source)
    targets["transposed"] = targets["transposed"].contiguous()
    receiver = BucketReceiver(targets)
    for bucket in buckets:
        receiver.apply(bucket)
    receiver.finish()
    for name, tensor in source.items():
        assert bitwise_equal(targets[name], tensor.contiguous()), name


def test_buckets_pickle_and_pieces_convert_to_json() -> None:
    source = {"w": torch.randn(5, 3), "b": torch.arange(4)}
    (bucket,) = iter_buckets(source.items(), bucket_bytes=1024)
    received = pickle.loads(pickle.dumps(bucket))
    targets = zeros_like_all(source)
    apply_bucket(targets, received)
    assert all(bitwise_equal(targets[name], source[name]) for name in source)
    as_json = json.dumps(cattrs.unstructure(bucket.pieces[0]))
    assert cattrs.structure(json.loads(as_json), TensorPiece) == bucket.pieces[0]


def test_a_short_last_bucket_pickles_to_its_own_size() -> None:
    """The last bucket does not drag the unused rest of a 1 MiB buffer along."""
    (bucket,) = iter_buckets([("w", torch.ones(3))], bucket_bytes=BYTES_PER_MB)
    assert bucket.nbytes == 12
    assert len(pickle.dumps(bucket)) < 2000


def test_buckets_are_built_on_the_requested_device() -> None:
    (bucket,) = iter_buckets([("w", torch.ones(3))], bucket_bytes=64, device="cpu")
    assert bucket.data.device == torch.device("cpu")


def test_bucket_bytes_for_converts_mebibytes() -> None:
    assert bucket_bytes_for(64) == 64 * BYTES_PER_MB
    assert bucket_bytes_for(0.5) == BYTES_PER_MB // 2
    assert bucket_bytes_for(0.05) == 52416  # 52428.8 rounded down to a multiple of 16


# ---------------------------------------------------------------------------
# Bucket mode in place: the receiver's weights laid out as the bucket stream

aligned_bucket_bytes = st.integers(1, 80).map(lambda n: n * ALIGNMENT)


@given(tensor_dicts(), st.integers(MIN_BUCKET_BYTES, 1200), st.sampled_from([None, torch.float16]))
def test_plan_buckets_predicts_the_pieces_iter_buckets_makes(
    source: dict[str, Tensor], bucket_bytes: int, cast: torch.dtype | None
) -> None:
    def after_cast(tensor: Tensor) -> torch.dtype:
        return cast if cast is not None and tensor.is_floating_point() else tensor.dtype

    specs = [(name, tuple(t.shape), after_cast(t)) for name, t in source.items()]
    made = [b.pieces for b in iter_buckets(source.items(), bucket_bytes, dtype=cast)]
    assert plan_buckets(specs, bucket_bytes) == made


@given(tensor_dicts(), aligned_bucket_bytes, seeds)
def test_a_sync_into_flat_buckets_writes_the_targets_in_place(
    source: dict[str, Tensor], bucket_bytes: int, seed: int
) -> None:
    targets = {name: random_tensor(tuple(t.shape), t.dtype, seed) for name, t in source.items()}
    before = clone_all(targets)
    if not targets:
        return
    flat = FlatBuckets(targets, bucket_bytes)
    for name, target in targets.items():  # re-homed, values kept
        assert bitwise_equal(target, before[name]), name
    receiver = BucketReceiver(targets)
    for bucket in iter_buckets(source.items(), bucket_bytes, into=flat):
        assert bucket.nbytes == 0 or bucket.data.data_ptr() == flat.window(bucket.index).data_ptr()
        receiver.apply(bucket)
    receiver.finish()
    for name, tensor in source.items():
        assert bitwise_equal(targets[name], tensor), name


def test_flat_buckets_re_home_a_modules_parameters() -> None:
    """The module keeps its Parameter objects, now views of one buffer, and computes the same."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)).requires_grad_(False)
    x = torch.randn(4, 5)
    expected = model(x)
    params = list(model.parameters())
    flat = FlatBuckets(model.state_dict(keep_vars=True), bucket_bytes=64)
    assert list(model.parameters()) == params
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())
    buffer = flat.buffer.untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() == buffer for p in model.parameters())
    assert torch.equal(model(x), expected)
    source = {name: t + 1 for name, t in model.state_dict().items()}
    receiver = BucketReceiver(model.state_dict(keep_vars=True))
    for bucket in iter_buckets(source.items(), 64, into=flat):
        receiver.apply(bucket)
    receiver.finish()
    assert all(torch.equal(model.state_dict()[n], t) for n, t in source.items())


def test_a_sender_whose_model_differs_from_the_plan_is_stopped_before_it_writes() -> None:
    targets = {"a": torch.zeros(4), "b": torch.zeros(4)}
    flat = FlatBuckets(targets, bucket_bytes=64)
    swapped = {"b": torch.ones(4), "a": torch.ones(4)}
    with pytest.raises(WeightSyncError, match=r"tensor 0 of the sync is 'b' .* layout has 'a'"):
        list(iter_buckets(swapped.items(), 64, into=flat))
    assert all(torch.equal(t, torch.zeros(4)) for t in targets.values())
    cast = r"'a' \(4,\) torch.float16, where .* 'a' \(4,\) torch.float32"
    with pytest.raises(WeightSyncError, match=cast):
        list(iter_buckets(targets.items(), 64, dtype=torch.float16, into=flat))
    with pytest.raises(WeightSyncError, match=r"sync incomplete: .* 1 more tensor.*'b'"):
        list(iter_buckets([("a", torch.ones(4))], 64, into=flat))
    with pytest.raises(WeightSyncError, match="differs from the 64 the receiver"):
        iter_buckets(targets.items(), 128, into=flat)
    with pytest.raises(WeightSyncError, match="multiple of 16, got 72"):
        FlatBuckets(targets, bucket_bytes=72)


def test_buckets_cast_floating_tensors_as_they_pack() -> None:
    source = {"w": torch.randn(40), "i": torch.arange(5)}
    cast = {"w": source["w"].to(torch.bfloat16), "i": source["i"]}
    packed = [b.data for b in iter_buckets(source.items(), 64, dtype=torch.bfloat16)]
    expected = [b.data for b in iter_buckets(cast.items(), 64)]
    assert len(packed) == len(expected) > 1
    assert all(torch.equal(a, b) for a, b in zip(packed, expected, strict=True))


def test_a_receiver_holds_state_between_syncs_only_until_finish() -> None:
    source = {"w": torch.randn(40)}
    targets = zeros_like_all(source)
    receiver = BucketReceiver(targets)
    for _ in range(2):
        for bucket in iter_buckets(source.items(), bucket_bytes=64):
            receiver.apply(bucket)
        assert receiver.coverage().complete
        assert receiver.finish() == 160
        assert receiver.bytes_applied == 0


# ---------------------------------------------------------------------------
# Coverage


def test_coverage_reports_every_kind_of_problem() -> None:
    source = {"a": torch.randn(10), "b": torch.randn(10), "c": torch.randn(3), "e": torch.empty(0)}
    buckets = list(iter_buckets(source.items(), bucket_bytes=16))
    pieces = [piece for bucket in buckets for piece in bucket.pieces]
    targets = zeros_like_all(source)
    assert sync_coverage(pieces, targets) == SyncCoverage()

    without_first = [piece for bucket in buckets[1:] for piece in bucket.pieces]
    assert sync_coverage(without_first, targets).incomplete == ("a",)
    twice = pieces + list(buckets[-1].pieces) + list(buckets[0].pieces)
    assert sync_coverage(twice, targets).repeated == ("a", "e")

    extra = TensorPiece("zz", (1,), "float32", 0, 1, 0)
    wrong = TensorPiece("c", (3,), "float16", 0, 3, 0)
    coverage = sync_coverage([*pieces, extra, wrong], targets)
    assert coverage.unknown == ("zz",)
    assert coverage.mismatched == ("c",)
    assert not coverage.complete


def test_coverage_check_names_the_problems() -> None:
    coverage = SyncCoverage(incomplete=["a", "b"], unknown=["zz"])
    with pytest.raises(WeightSyncError, match=r"targets not fully received: 'a', 'b'.*lack: 'zz'"):
        coverage.check()
    SyncCoverage().check()


def test_a_receiver_rejects_an_incomplete_sync() -> None:
    source = {"a": torch.randn(10), "b": torch.randn(10)}
    receiver = BucketReceiver(zeros_like_all(source))
    first, *_ = iter_buckets(source.items(), bucket_bytes=16)
    receiver.apply(first)
    with pytest.raises(WeightSyncError, match=r"not fully received: 'a', 'b'"):
        receiver.finish()
    assert receiver.bytes_applied == 0  # the next sync starts clean


# ---------------------------------------------------------------------------
# Bucket mode: errors


@pytest.mark.parametrize("bucket_bytes", [0, -1, MIN_BUCKET_BYTES - 1])
def test_iter_buckets_rejects_too_small_buckets_before_pulling(bucket_bytes: int) -> None:
    source = CountingSource({"w": torch.ones(3)})
    with pytest.raises(
        ValueError, match=rf"bucket_bytes: expected an integer ≥ 16 .*got {bucket_bytes}"
    ):
        iter_buckets(source, bucket_bytes)
    assert source.pulled == 0


def test_iter_buckets_rejects_a_repeated_name() -> None:
    with pytest.raises(WeightSyncError, match="parameter 'w' given twice"):
        list(iter_buckets([("w", torch.ones(2)), ("w", torch.ones(2))], 64))


@pytest.mark.parametrize("mb", [0, -1.0, float("nan"), float("inf"), 1e-9])
def test_bucket_bytes_for_rejects_non_positive_and_tiny_sizes(mb: float) -> None:
    with pytest.raises(ValueError, match=r"rollout\.bucket_size_mb: "):
        bucket_bytes_for(mb)


def one_bucket(name: str = "layer.weight") -> Bucket:
    (bucket,) = iter_buckets([(name, torch.ones(2, 3))], bucket_bytes=1024)
    return bucket


def test_apply_bucket_names_an_unknown_parameter() -> None:
    targets = {"layer.weights": torch.zeros(2, 3)}
    with pytest.raises(
        WeightSyncError,
        match=re.escape(
            "bucket 0 carries parameter 'layer.weight', which the targets lack "
            "(did you mean 'layer.weights'?)"
        ),
    ):
        apply_bucket(targets, one_bucket())


def test_apply_bucket_names_a_shape_mismatch() -> None:
    targets = {"layer.weight": torch.zeros(3, 2)}
    with pytest.raises(
        WeightSyncError,
        match=re.escape(
            "parameter 'layer.weight': bucket 0 carries shape (2, 3), the target has shape (3, 2)"
        ),
    ):
        apply_bucket(targets, one_bucket())


def test_apply_bucket_names_a_dtype_mismatch() -> None:
    targets = {"layer.weight": torch.zeros(2, 3, dtype=torch.bfloat16)}
    with pytest.raises(
        WeightSyncError,
        match=r"parameter 'layer.weight': bucket 0 carries dtype float32, "
        r"the target has dtype bfloat16; cast on the sending side",
    ):
        apply_bucket(targets, one_bucket())


def test_apply_bucket_rejects_a_non_contiguous_target() -> None:
    targets = {"layer.weight": torch.zeros(3, 2).t()}
    with pytest.raises(WeightSyncError, match=r"'layer\.weight': the target is not contiguous"):
        apply_bucket(targets, one_bucket())


def test_decode_rejects_a_piece_past_the_end() -> None:
    bucket = one_bucket()
    broken = Bucket(0, [TensorPiece("w", (8,), "float32", 0, 8, 0)], bucket.data)
    with pytest.raises(WeightSyncError, match=r"bucket 0: the piece of 'w' spans bytes \[0, 32\)"):
        list(decode_bucket(broken))


# ---------------------------------------------------------------------------
# Patch mode: properties


@given(snapshot_and_current())
def test_a_patch_takes_the_snapshot_to_current_bitwise(
    pair: tuple[dict[str, Tensor], dict[str, Tensor]],
) -> None:
    snapshot, current = pair
    patch = encode_patch(current, snapshot)
    assert not patch.full
    targets = clone_all(snapshot)
    assert apply_patch(targets, patch) == patch.nbytes
    for name, tensor in current.items():
        assert bitwise_equal(targets[name], tensor), name


@given(snapshot_and_current())
def test_a_patch_holds_exactly_the_changed_positions(
    pair: tuple[dict[str, Tensor], dict[str, Tensor]],
) -> None:
    snapshot, current = pair
    entries = {entry.name: entry for entry in encode_patch(current, snapshot).entries}
    for name, tensor in current.items():
        changed = changed_positions(snapshot[name], tensor)
        if changed.numel() == 0:
            assert name not in entries
            continue
        entry = entries[name]
        assert entry.shape == tuple(tensor.shape)
        sparse_bytes = changed.numel() * (2 + tensor.element_size()) + 4 * blocks_of(tensor)
        if entry.indices is None:  # whole: only when offsets would cost as much
            assert entry.whole
            assert sparse_bytes >= entry.values.nbytes
            assert bitwise_equal(entry.values, tensor.reshape(-1))
        else:
            assert entry.offsets is not None
            assert entry.offsets.dtype == torch.int16
            assert entry.block_counts is not None
            assert entry.block_counts.dtype == torch.int32
            assert entry.nbytes == sparse_bytes
            assert torch.equal(entry.indices, changed)
            assert bitwise_equal(entry.values, tensor.reshape(-1)[changed])
    assert Patch(list(entries.values()), full=False).nbytes == patch_nbytes(entries)


def blocks_of(tensor: Tensor) -> int:
    return math.ceil(tensor.numel() / PATCH_BLOCK)


def patch_nbytes(entries: dict[str, PatchEntry]) -> int:
    """What the entries cost: 2 bytes per change and 4 per block on top of the values."""
    return sum(
        entry.values.nbytes
        + (
            0
            if entry.whole
            else 2 * entry.values.numel() + 4 * math.ceil(math.prod(entry.shape) / PATCH_BLOCK)
        )
        for entry in entries.values()
    )


@given(tensor_dicts())
def test_a_full_patch_round_trips(source: dict[str, Tensor]) -> None:
    patch = encode_patch(source, None)
    assert patch.full
    assert [entry.name for entry in patch.entries] == list(source)
    assert all(entry.whole for entry in patch.entries)
    assert patch.nbytes == total_bytes(source)
    targets = zeros_like_all(source)
    apply_patch(targets, patch)
    assert all(bitwise_equal(targets[name], source[name]) for name in source)


@given(
    tensor_dicts(), st.lists(st.sampled_from([0.0, 0.01, 0.3, 1.0]), min_size=1, max_size=4), seeds
)
def test_an_encoder_keeps_the_engine_in_step_over_many_syncs(
    start: dict[str, Tensor], fractions: list[float], seed: int
) -> None:
    encoder = PatchEncoder()
    engine = zeros_like_all(start)
    current = clone_all(start)
    first = encoder.encode(current)
    assert first.full
    apply_patch(engine, first)
    for step, fraction in enumerate(fractions):
        current = {
            name: perturbed(tensor, fraction, seed + 7 * step + i)
            for i, (name, tensor) in enumerate(current.items())
        }
        patch = encoder.encode(current)
        assert not patch.full
        assert not encoder.needs_full
        apply_patch(engine, patch)
        assert all(bitwise_equal(engine[name], current[name]) for name in current)
    encoder.reset()
    assert encoder.needs_full
    assert encoder.encode(current).full


@given(snapshot_and_current(), st.integers(MIN_BUCKET_BYTES, 600))
def test_iter_patches_streams_chunks_of_at_most_max_bytes(
    pair: tuple[dict[str, Tensor], dict[str, Tensor]], max_bytes: int
) -> None:
    snapshot, current = pair
    encoder = PatchEncoder()
    assert all(patch.full for patch in encoder.iter_patches(snapshot.items(), max_bytes))
    engine = clone_all(snapshot)
    expected = encode_patch(current, snapshot)
    patches = list(encoder.iter_patches(current.items(), max_bytes))
    for patch in patches:
        assert not patch.full
        assert patch.entries
        assert patch.nbytes <= max_bytes or len(patch.entries) == 1
        apply_patch(engine, patch)
    streamed = [(entry.name, entry.nbytes) for patch in patches for entry in patch.entries]
    assert streamed == [(entry.name, entry.nbytes) for entry in expected.entries]
    assert all(bitwise_equal(engine[name], current[name]) for name in current)


# ---------------------------------------------------------------------------
# Patch mode: hand-made cases


def test_signed_zeros_and_nan_payloads_are_compared_bitwise() -> None:
    quiet_nan = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    other_nan = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    before = torch.cat([quiet_nan, torch.tensor([0.0, 1.0, -0.0]), quiet_nan, torch.zeros(20)])
    after = torch.cat([quiet_nan, torch.tensor([-0.0, 1.0, 0.0]), other_nan, torch.zeros(20)])
    entry = encode_entry("w", after, before)
    assert entry is not None
    assert entry.indices is not None
    assert entry.indices.tolist() == [1, 3, 4]
    assert entry.nbytes == 3 * (2 + 4) + 4
    engine = before.clone()
    apply_patch({"w": engine}, Patch([entry], full=False))
    assert bitwise_equal(engine, after)


def test_an_unchanged_tensor_has_no_entry() -> None:
    weight = torch.tensor([float("nan"), -0.0, 2.0])
    assert encode_entry("w", weight, weight.clone()) is None
    assert encode_patch({"w": weight}, {"w": weight.clone()}).entries == ()


def test_a_dense_change_is_sent_whole() -> None:
    before = torch.zeros(10, dtype=torch.bfloat16)
    after = before.clone()
    after[:4] = 1.0  # 4 × (2 + 2) bytes of offsets and values + 4 of block count ≥ 20 whole
    entry = encode_entry("w", after, before)
    assert entry is not None
    assert entry.whole
    assert entry.nbytes == 20


def flipped(before: Tensor, positions: list[int]) -> Tensor:
    """``before`` with the lowest bit of each element at the flat ``positions`` flipped."""
    bits = before.reshape(-1).view(INT_OF_SIZE[before.element_size()]).clone()
    where = torch.tensor(sorted(set(positions)), dtype=torch.int64)
    bits[where] ^= 1
    return bits.view(before.dtype).reshape(before.shape)


def test_changes_in_several_blocks_round_trip() -> None:
    numel = 3 * PATCH_BLOCK + 100  # the last block is partial
    before = random_tensor((numel,), torch.bfloat16, seed=1)
    positions = [0, 40_000, 65_535, 65_536, 65_537, 2 * PATCH_BLOCK + 5, 3 * PATCH_BLOCK, numel - 1]
    after = flipped(before, positions)
    entry = encode_entry("w", after, before)
    assert entry is not None
    assert entry.offsets is not None
    assert entry.block_counts is not None
    assert entry.block_counts.tolist() == [3, 2, 1, 2]
    assert (entry.offsets.int() & 0xFFFF).tolist() == [0, 40_000, 65_535, 0, 1, 5, 0, 99]
    assert entry.indices is not None
    assert entry.indices.tolist() == positions
    assert entry.nbytes == len(positions) * (2 + 2) + 4 * 4
    engine = before.clone()
    apply_patch({"w": engine}, pickle.loads(pickle.dumps(Patch([entry], full=False))))
    assert bitwise_equal(engine, after)


def test_changes_in_one_block_of_many_round_trip() -> None:
    before = random_tensor((500, 400), torch.float32, seed=2)  # 200,000 elements: 4 blocks
    positions = [PATCH_BLOCK + 3, PATCH_BLOCK + 1_000, 2 * PATCH_BLOCK - 1]
    after = flipped(before, positions)
    entry = encode_entry("w", after, before)
    assert entry is not None
    assert entry.block_counts is not None
    assert entry.block_counts.tolist() == [0, 3, 0, 0]
    assert entry.indices is not None
    assert entry.indices.tolist() == positions
    engine = before.clone()
    apply_patch({"w": engine}, Patch([entry], full=False))
    assert bitwise_equal(engine, after)


@st.composite
def multi_block_changes(draw: st.DrawFn) -> tuple[Tensor, list[int]]:
    """A tensor of up to four blocks and positions to change, many at block edges."""
    numel = draw(st.integers(1, 4 * PATCH_BLOCK))
    dtype = draw(st.sampled_from(DTYPES))
    edges = [i for k in range(1, 5) for i in (k * PATCH_BLOCK - 1, k * PATCH_BLOCK) if i < numel]
    position = st.integers(0, numel - 1) | st.sampled_from([0, numel - 1, *edges])
    return random_tensor((numel,), dtype, draw(seeds)), draw(st.lists(position, max_size=40))


@given(multi_block_changes())
def test_a_patch_across_blocks_takes_the_snapshot_to_current_bitwise(
    case: tuple[Tensor, list[int]],
) -> None:
    before, positions = case
    after = flipped(before, positions) if positions else before.clone()
    entry = encode_entry("w", after, before)
    if not positions:
        assert entry is None
        return
    assert entry is not None
    changed = sorted(set(positions))
    if entry.indices is None:  # whole: only when offsets would cost as much
        sparse_bytes = len(changed) * (2 + before.element_size()) + 4 * blocks_of(before)
        assert sparse_bytes >= before.numel() * before.element_size()
    else:
        assert entry.indices.tolist() == changed
    engine = before.clone()
    apply_patch({"w": engine}, Patch([entry], full=False))
    assert bitwise_equal(engine, after)


def test_a_bf16_step_changing_4_percent_costs_under_a_tenth_of_the_weights() -> None:
    """A bf16 AdamW step at lr 1e-6 changes about 4.3% of the weights."""
    generator = torch.Generator().manual_seed(0)
    numel = 300_000
    before = torch.randn(numel, generator=generator).bfloat16()
    positions = torch.randperm(numel, generator=generator)[: round(0.043 * numel)]
    entry = encode_entry("w", flipped(before, positions.tolist()), before)
    assert entry is not None
    assert not entry.whole
    assert entry.nbytes <= 0.1 * numel * 2


def test_patches_pickle() -> None:
    before = torch.zeros(50)
    after = before.clone()
    after[7] = 3.0
    patch = pickle.loads(pickle.dumps(encode_patch({"w": after}, {"w": before})))
    engine = {"w": before.clone()}
    apply_patch(engine, patch)
    assert bitwise_equal(engine["w"], after)


def test_a_small_adamw_like_update_costs_a_tenth_of_a_full_sync() -> None:
    """An update touching ~1% of the entries: indices and values stay under 10% of the weights."""
    generator = torch.Generator().manual_seed(0)
    weights = {
        "embed": torch.randn(1000, 64, generator=generator),
        "layer.weight": torch.randn(256, 256, generator=generator).bfloat16(),
        "layer.bias": torch.randn(256, generator=generator),
    }
    encoder = PatchEncoder()
    encoder.encode(weights)
    stepped = {}
    for name, weight in weights.items():
        touched = torch.rand(weight.shape, generator=generator) < 0.01
        update = 1e-3 * torch.randn(weight.shape, generator=generator).sign()
        stepped[name] = torch.where(touched, weight - update.to(weight.dtype), weight)
    patch = encoder.encode(stepped)
    assert 0 < patch.nbytes <= 0.1 * total_bytes(weights)


def test_an_interrupted_sync_makes_the_next_one_full() -> None:
    weights = {"a": torch.zeros(40), "b": torch.zeros(40)}
    encoder = PatchEncoder()
    encoder.encode(weights)
    changed = {name: tensor + 1 for name, tensor in weights.items()}
    patches = encoder.iter_patches(changed.items(), max_bytes=MIN_BUCKET_BYTES)
    next(patches)  # the consumer stops here: the engine may be behind
    assert encoder.needs_full
    assert encoder.encode(changed).full


def test_an_encoder_can_keep_its_snapshot_elsewhere() -> None:
    encoder = PatchEncoder(snapshot_device="cpu")
    weight = torch.zeros(30)
    encoder.encode({"w": weight})
    weight[3] = 1.0
    (entry,) = encoder.encode({"w": weight}).entries
    assert entry.indices is not None
    assert entry.indices.tolist() == [3]


# ---------------------------------------------------------------------------
# Patch mode: errors


def test_encode_patch_names_parameters_on_one_side_only() -> None:
    with pytest.raises(
        WeightSyncError,
        match=re.escape(
            "current and snapshot name different parameters (only in current: 'new'; "
            "only in snapshot: 'old'); a changed model needs a full sync (snapshot=None)"
        ),
    ):
        encode_patch({"new": torch.zeros(2)}, {"old": torch.zeros(2)})


def test_encode_patch_names_a_shape_mismatch() -> None:
    with pytest.raises(
        WeightSyncError, match=re.escape("parameter 'w': current shape (2, 3), snapshot shape (6,)")
    ):
        encode_patch({"w": torch.zeros(2, 3)}, {"w": torch.zeros(6)})


def test_encode_patch_names_a_dtype_mismatch() -> None:
    with pytest.raises(
        WeightSyncError, match="parameter 'w': current dtype float16, snapshot dtype float32"
    ):
        encode_patch({"w": torch.zeros(2, dtype=torch.float16)}, {"w": torch.zeros(2)})


def test_patch_mode_rejects_elements_it_cannot_compare() -> None:
    value = torch.zeros(2, dtype=torch.complex128)
    with pytest.raises(WeightSyncError, match=r"'z': patch mode handles elements of 1, 2, 4 or 8"):
        encode_entry("z", value, value.clone())


def small_patch() -> Patch:
    return encode_patch({"layer.weight": torch.ones(2, 3)}, None)


def test_apply_patch_names_an_unknown_parameter() -> None:
    with pytest.raises(
        WeightSyncError,
        match=re.escape("the patch carries parameter 'layer.weight', which the targets lack"),
    ):
        apply_patch({"head.weight": torch.zeros(2, 3)}, small_patch())


def test_apply_patch_names_a_shape_mismatch() -> None:
    with pytest.raises(
        WeightSyncError,
        match=re.escape("parameter 'layer.weight': the patch carries shape (2, 3), the target"),
    ):
        apply_patch({"layer.weight": torch.zeros(6)}, small_patch())


def test_apply_patch_names_a_dtype_mismatch() -> None:
    with pytest.raises(
        WeightSyncError, match="the patch carries dtype float32, the target has dtype int64"
    ):
        apply_patch({"layer.weight": torch.zeros(2, 3, dtype=torch.int64)}, small_patch())


def test_an_encoder_rejects_a_parameter_missing_or_new_since_the_full_sync() -> None:
    encoder = PatchEncoder()
    encoder.encode({"a": torch.zeros(2), "b": torch.zeros(2)})
    with pytest.raises(WeightSyncError, match=r"sync incomplete: 1 parameter\(s\) .*: 'b'"):
        encoder.encode({"a": torch.ones(2)})
    assert encoder.needs_full
    encoder.encode({"a": torch.zeros(2), "b": torch.zeros(2)})
    with pytest.raises(WeightSyncError, match="parameter 'c' was not in the last full sync"):
        encoder.encode({"a": torch.zeros(2), "c": torch.zeros(2)})


def offsets_of(*offsets: int) -> Tensor:
    return torch.tensor(offsets, dtype=torch.int16)


def counts_of(*counts: int) -> Tensor:
    return torch.tensor(counts, dtype=torch.int32)


def test_records_reject_inconsistent_fields() -> None:
    with pytest.raises(WeightSyncError, match="'w': values must be flat float32, got float16"):
        PatchEntry("w", (2,), "float32", None, None, torch.zeros(2, dtype=torch.float16))
    with pytest.raises(WeightSyncError, match="'w': a whole entry needs 4 values"):
        PatchEntry("w", (2, 2), "float32", None, None, torch.zeros(3))
    with pytest.raises(WeightSyncError, match="'w': offsets and block_counts must be both given"):
        PatchEntry("w", (4,), "float32", offsets_of(1), None, torch.ones(1))
    with pytest.raises(WeightSyncError, match="'w': offsets must be flat int16, got int32"):
        PatchEntry("w", (4,), "float32", counts_of(1), counts_of(1), torch.ones(1))
    partial = PatchEntry("w", (4,), "float32", offsets_of(1), counts_of(1), torch.ones(1))
    with pytest.raises(WeightSyncError, match=r"a full patch holds every entry whole.*'w'"):
        Patch([partial], full=True)
    with pytest.raises(WeightSyncError, match="max_bytes: expected an integer ≥ 16"):
        PatchEncoder().iter_patches([], max_bytes=0)


def test_patch_entries_reject_inconsistent_block_counts() -> None:
    numel = PATCH_BLOCK + 1  # two blocks
    values = torch.ones(2)
    with pytest.raises(
        WeightSyncError,
        match=re.escape(
            "'w': block_counts must be flat int32 with one count per block of 65536 "
            "elements (2 for shape (65537,)), got int32 of shape (1,)"
        ),
    ):
        PatchEntry("w", (numel,), "float32", offsets_of(0, 1), counts_of(2), values)
    with pytest.raises(WeightSyncError, match="'w': block_counts must be flat int32"):
        PatchEntry("w", (numel,), "float32", offsets_of(0, 1), counts_of(1, 1).long(), values)
    with pytest.raises(WeightSyncError, match="'w': block_counts must not be negative"):
        PatchEntry("w", (numel,), "float32", offsets_of(0, 1), counts_of(3, -1), values)
    with pytest.raises(
        WeightSyncError,
        match=re.escape("'w': block_counts add up to 3 changes, with 2 offsets and 2 values"),
    ):
        PatchEntry("w", (numel,), "float32", offsets_of(0, 1), counts_of(2, 1), values)
    with pytest.raises(WeightSyncError, match="with 3 offsets and 2 values"):
        PatchEntry("w", (numel,), "float32", offsets_of(0, 1, 2), counts_of(2, 1), values)
    entry = PatchEntry("w", (numel,), "float32", offsets_of(-1, 0), counts_of(1, 1), values)
    assert entry.indices is not None
    assert entry.indices.tolist() == [65_535, 65_536]
