"""In-memory weight delivery: `WeightSender.send_in_memory` into an engine's tensors, all modes."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from rlshell.sync.codec import FlatBuckets, WeightSyncError, bucket_bytes_for, iter_buckets
from rlshell.sync.transfer import WeightReceiver, WeightSender

MB = 0.0005  # 512 bytes (524 rounded down to a multiple of 16): several buckets below


def model_state(seed: int) -> dict[str, Tensor]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 20), torch.nn.Linear(20, 9))
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def engine(dtype: torch.dtype) -> dict[str, Tensor]:
    return {name: torch.zeros_like(t, dtype=dtype) for name, t in model_state(0).items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_place", [False, True], ids=["own-buffers", "flat"])
def test_bucket_syncs_in_memory_leave_the_engine_equal_to_the_cast_weights(
    dtype: torch.dtype, in_place: bool
) -> None:
    targets = engine(dtype)
    flat = FlatBuckets(targets, bucket_bytes_for(MB)) if in_place else None
    sender = WeightSender("bucket", MB, dtype=dtype)
    for seed in (1, 2):
        state = model_state(seed)
        stats = sender.send_in_memory(state.items(), targets, full=False, flat=flat)
        assert all(torch.equal(targets[n], t.to(dtype)) for n, t in state.items())
        assert stats["bytes"] == sum(t.numel() * dtype.itemsize for t in state.values())
        assert stats["messages"] > 1


def test_a_target_moved_out_of_its_flat_place_still_ends_up_synced() -> None:
    targets = engine(torch.float32)
    flat = FlatBuckets(targets, bucket_bytes_for(MB))
    targets["0.weight"].data = torch.zeros(20, 6)  # no longer a view of the flat buffer
    state = model_state(3)
    WeightSender("bucket", MB).send_in_memory(state.items(), targets, full=False, flat=flat)
    assert all(torch.equal(targets[n], t) for n, t in state.items())


def test_an_in_place_sync_must_bring_every_bucket_once() -> None:
    targets = engine(torch.float32)
    bucket_bytes = bucket_bytes_for(MB)
    flat = FlatBuckets(targets, bucket_bytes)
    buckets = list(iter_buckets(model_state(4).items(), bucket_bytes, into=flat))
    receiver = WeightReceiver(targets, flat)
    for bucket in buckets[:-1] + buckets[:1]:
        receiver.receive(bucket)
    with pytest.raises(WeightSyncError, match=rf"missing \[{len(buckets) - 1}\], repeated \[0\]"):
        receiver.finish(check_coverage=True)


def test_patch_syncs_ignore_the_flat_layout() -> None:
    targets = engine(torch.bfloat16)
    flat = FlatBuckets(targets, bucket_bytes_for(MB))
    sender = WeightSender("patch", MB, dtype=torch.bfloat16)
    sender.send_in_memory(model_state(1).items(), targets, full=True, flat=flat)
    state = model_state(1)
    state["1.bias"][0] += 1.0
    stats = sender.send_in_memory(state.items(), targets, full=False, flat=flat)
    assert stats["bytes"] < 100
    assert all(torch.equal(targets[n], t.to(torch.bfloat16)) for n, t in state.items())
