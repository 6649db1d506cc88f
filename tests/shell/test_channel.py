"""Channels between worker groups (`rlshell.cluster.channel`) on a real local Ray cluster.

Items go from one group's workers to another's; the failure paths are each
provoked for real: a full queue, an empty one, a closed channel, a sender that
died with its item, a sender that died while its reader waited, a dead queue.
The worker classes live at module level so Ray workers can import them by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray
import torch
from ray.exceptions import OwnerDiedError

from rlshell.cluster.channel import (
    Channel,
    ChannelClosed,
    ChannelEmpty,
    ChannelError,
    ChannelFull,
    ChannelPeerDied,
    _actor_state,
)
from rlshell.cluster.errors import WorkerError
from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import ComponentPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.cluster.worker import Worker

PlanFactory = Callable[..., ComponentPlan]


class Sender(Worker):
    def send(self, channel: Channel, count: int, key: str = "default") -> int:
        """``count`` batches, each tagged with this rank and its index; how many were sent."""
        for index in range(count):
            batch = {"rank": torch.tensor(self.rank), "values": torch.arange(4) + 10 * index}
            channel.put(batch, key=key)
        return count

    def send_to_all(self, channel: Channel, keys: list[str]) -> None:
        channel.broadcast({"from": self.rank, "values": torch.ones(3)}, keys)


class Receiver(Worker):
    def receive(self, channel: Channel, count: int, key: str = "default") -> list[Any]:
        return [channel.get(key=key, timeout=60.0) for _ in range(count)]

    def receive_one(self, channel: Channel, key: str, timeout: float | None) -> Any:
        return channel.get(key=key, timeout=timeout)


@pytest.fixture
def groups(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> Iterator[tuple[WorkerGroup[Sender], WorkerGroup[Receiver]]]:
    senders = Sender.create_group().launch(ray_cluster, plan_component("sender", world_size=2))
    receivers = Receiver.create_group().launch(ray_cluster, plan_component("receiver", 1))
    try:
        yield senders, receivers
    finally:
        senders.shutdown()
        receivers.shutdown()


@pytest.fixture
def channel(ray_cluster: Cluster) -> Iterator[Channel]:
    made = Channel.create("test", maxsize=2)
    yield made
    made.close(kill=True)


def test_batches_go_from_one_groups_workers_to_anothers_in_order(
    groups: tuple[WorkerGroup[Sender], WorkerGroup[Receiver]], channel: Channel
) -> None:
    senders, receivers = groups
    # Each sender rank has a key of its own, so the order within a key is the sender's.
    sent = [senders.execute_on(rank).send(channel, 3, key=f"rank{rank}") for rank in (0, 1)]
    received = [receivers.receive(channel, 3, key=f"rank{rank}") for rank in (0, 1)]
    assert [call.wait() for call in sent] == [[3], [3]]
    for rank, call in enumerate(received):
        (batches,) = call.wait()
        assert [int(b["rank"]) for b in batches] == [rank] * 3
        for index, batch in enumerate(batches):
            assert torch.equal(batch["values"], torch.arange(4) + 10 * index)
    assert channel.qsize("rank0") == channel.qsize("rank1") == 0


def test_a_broadcast_reaches_every_key(
    groups: tuple[WorkerGroup[Sender], WorkerGroup[Receiver]], channel: Channel
) -> None:
    senders, _ = groups
    senders.execute_on(1).send_to_all(channel, ["a", "b", "c"]).wait()
    for key in ("a", "b", "c"):
        item = channel.get(key, timeout=10.0)
        assert item["from"] == 1
        assert torch.equal(item["values"], torch.ones(3))


def test_a_full_channel_holds_the_sender_back_until_an_item_is_taken(
    groups: tuple[WorkerGroup[Sender], WorkerGroup[Receiver]], channel: Channel
) -> None:
    senders, _ = groups
    call = senders.execute_on(0).send(channel, 4)  # maxsize 2: two wait for room
    time.sleep(2.0)
    assert not call.done()
    assert channel.qsize() == 2
    got = [channel.get(timeout=30.0) for _ in range(4)]
    assert call.wait(timeout=30.0) == [4]
    assert [int(b["values"][0]) for b in got] == [0, 10, 20, 30]


def test_put_into_a_full_channel_times_out_with_channel_full(channel: Channel) -> None:
    channel.put("one")
    channel.put("two")
    started = time.monotonic()
    with pytest.raises(ChannelFull, match=r"no room under key\(s\) \['default'\] within 0.5 s"):
        channel.put("three", timeout=0.5)
    assert 0.4 < time.monotonic() - started < 5.0
    assert channel.get() == "one"
    channel.put("three", timeout=0.5)  # room again
    assert [channel.get(), channel.get()] == ["two", "three"]


def test_get_from_an_empty_channel_times_out_with_channel_empty(channel: Channel) -> None:
    started = time.monotonic()
    with pytest.raises(ChannelEmpty, match=r"nothing arrived under key 'k' within 1.5 s"):
        channel.get("k", timeout=1.5)
    assert 1.4 < time.monotonic() - started < 6.0
    assert isinstance(ChannelEmpty("x"), TimeoutError)


def test_a_closed_channel_raises_channel_closed_at_both_ends(
    groups: tuple[WorkerGroup[Sender], WorkerGroup[Receiver]], channel: Channel
) -> None:
    senders, receivers = groups
    channel.put("before")
    waiting = receivers.receive(channel, 2)  # gets "before", then waits
    time.sleep(1.5)
    channel.close("the run ended")
    with pytest.raises(WorkerError) as raised:
        waiting.wait(timeout=30.0)
    assert isinstance(raised.value, ChannelClosed)
    assert "nothing is left under key 'default' (the run ended)" in str(raised.value)
    with pytest.raises(ChannelClosed, match=r"closed, nothing can be put \(the run ended\)"):
        channel.put("after")
    with pytest.raises(WorkerError, match="ChannelClosed"):
        senders.execute_on(0).send(channel, 1).wait(timeout=30.0)
    assert channel.closed()
    channel.close()  # twice: nothing changes


def test_items_put_before_the_close_are_still_delivered(channel: Channel) -> None:
    channel.put(1)
    channel.close()
    assert channel.get(timeout=5.0) == 1
    with pytest.raises(ChannelClosed):
        channel.get(timeout=5.0)


def _wait_until_dead(actor_id: str) -> None:
    """Until Ray's GCS has the actor dead (a kill is asynchronous)."""
    deadline = time.monotonic() + 30.0
    while _actor_state(actor_id) != "DEAD":
        assert time.monotonic() < deadline, "the killed sender is still alive after 30 s"
        time.sleep(0.2)


def test_an_item_whose_sender_died_is_still_read_from_its_nodes_store(
    ray_cluster: Cluster, plan_component: PlanFactory, channel: Channel
) -> None:
    plan = plan_component("dying-sender", world_size=1)
    sender = Sender.create_group().launch(ray_cluster, plan)
    sender.send(channel, 1).wait()
    actor_id = sender._handles[0]._actor_id.hex()
    sender.shutdown()
    _wait_until_dead(actor_id)
    assert torch.equal(channel.get(timeout=30.0)["values"], torch.arange(4))


def test_an_item_lost_with_its_sender_raises_peer_died_naming_the_sender(
    channel: Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a reader on another node meets once the sender (the object's owner) died: Ray
    # cannot fetch the object. One node always still has it (the test above), so Ray's
    # answer for the item is put in by hand.
    fetch = ray.get

    def owner_gone(ref: Any, **kwargs: Any) -> Any:
        value = fetch(ref, **kwargs)
        if isinstance(value, str) and value == "the item":
            raise OwnerDiedError(ref.hex(), None, "")
        return value

    channel.put("the item")
    monkeypatch.setattr(ray, "get", owner_gone)
    with pytest.raises(
        ChannelPeerDied,
        match=r"from the driver \(pid \d+\) is lost before it was read: OwnerDiedError",
    ):
        channel.get(timeout=30.0)


def test_a_reader_waiting_on_a_dead_senders_key_is_told(
    ray_cluster: Cluster, plan_component: PlanFactory, channel: Channel
) -> None:
    plan = plan_component("gone-sender", world_size=1)
    sender = Sender.create_group().launch(ray_cluster, plan)
    sender.send(channel, 1).wait()
    assert int(channel.get(timeout=10.0)["rank"]) == 0
    sender.shutdown()
    started = time.monotonic()
    with pytest.raises(
        ChannelPeerDied, match=rf"{plan.name}:0 \(pid \d+\), which put into it, died while the "
    ):
        channel.get(timeout=60.0)
    assert time.monotonic() - started < 30.0  # told long before the timeout


def test_a_sender_held_back_by_a_dead_reader_is_told(
    ray_cluster: Cluster, plan_component: PlanFactory, channel: Channel
) -> None:
    plan = plan_component("gone-reader", world_size=1)
    reader = Receiver.create_group().launch(ray_cluster, plan)
    channel.put("first")
    assert reader.receive_one(channel, "default", 10.0).wait() == ["first"]
    actor_id = reader._handles[0]._actor_id.hex()
    reader.shutdown()
    _wait_until_dead(actor_id)
    channel.put(1)
    channel.put(2)  # full: maxsize 2
    started = time.monotonic()
    with pytest.raises(
        ChannelPeerDied, match=rf"{plan.name}:0 \(pid \d+\), which took from it, died while"
    ):
        channel.put(3, timeout=60.0)
    assert time.monotonic() - started < 30.0


def test_a_dead_queue_raises_peer_died(channel: Channel) -> None:
    ray.kill(channel._queues)
    with pytest.raises(ChannelPeerDied, match="its queue actor died"):
        channel.put("x", timeout=5.0)
    assert issubclass(ChannelPeerDied, ChannelError)


def test_a_channel_holds_at_least_one_item(ray_cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="maxsize must be at least 1, got 0"):
        Channel.create("none", maxsize=0)


# ---------------------------------------------------------------- in the pipelined runner


def _pipelined_windows(
    ray_cluster: Cluster, plan_component: PlanFactory, through_channel: bool, windows: int
) -> list[list[Any]]:
    """Each window's rollout and env windows of two env workers in two stages served by one
    rollout worker: read from a channel under both actor ranks' keys, or handed back."""
    from rlshell.runners.embodied_pipeline import Pipeline
    from rlshell.workers.embodied_pipeline import EnvWorker, PipelineRolloutWorker
    from tests.shell.test_embodied_pipeline import HYBRID, cartpole

    config = cartpole(
        f"cluster.component_placement={HYBRID}",
        "env.max_episode_steps=9",
        "rollout.pipeline_stage_num=2",
    )
    envs = EnvWorker.create_group(config).launch(ray_cluster, plan_component("env", 2))
    rollout = PipelineRolloutWorker.create_group(config).launch(
        ray_cluster, plan_component("rollout", 1)
    )
    channel = Channel.create("windows", maxsize=4)
    try:
        envs.init_worker(rollout.init_worker().wait()[0]).wait()
        pipeline = Pipeline(envs, rollout, 5, 2, (channel, 2) if through_channel else None)
        got = []
        for _ in range(windows):
            submitted = pipeline.submit()
            env_parts = submitted.wait(submitted.env_windows)
            rollout_parts = [submitted.wait(call)[0] for call in submitted.rollout_windows]
            if not through_channel:
                got.append(rollout_parts + env_parts)
                continue
            assert rollout_parts == [None, None]  # nothing came back through the driver
            assert all(set(m) >= {"env/steps", "time/env_busy"} for m in env_parts)
            per_rank = [
                [channel.get((submitted.number, rank), timeout=60.0) for _ in range(4)]
                for rank in range(2)
            ]
            assert [type(w).__name__ for w in per_rank[0]] == [
                type(w).__name__ for w in per_rank[1]
            ]
            got.append(per_rank[1])
        assert channel.qsize((0, 0)) == 0
        return got
    finally:
        envs.shutdown()
        rollout.shutdown()
        channel.close(kill=True)


def _kind_and_rank(window: Any) -> tuple[str, int]:
    return type(window).__name__, window.env_rank


def test_the_pipeline_sends_through_the_channel_the_windows_it_handed_the_driver(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    from rlshell.workers.embodied_pipeline import EnvWindow, RolloutWindow

    # The rollout worker samples from its own seeded stream, the envs from theirs: two
    # pipelines of the same config act alike.
    through_driver = _pipelined_windows(ray_cluster, plan_component, False, windows=2)
    through_channel = _pipelined_windows(ray_cluster, plan_component, True, windows=2)
    for handed, sent in zip(through_driver, through_channel, strict=True):
        handed, sent = sorted(handed, key=_kind_and_rank), sorted(sent, key=_kind_and_rank)
        assert [_kind_and_rank(w) for w in sent] == [
            ("EnvWindow", 0),
            ("EnvWindow", 1),
            ("RolloutWindow", 0),
            ("RolloutWindow", 1),
        ]
        for a, b in zip(handed, sent, strict=True):
            if isinstance(a, RolloutWindow):
                assert isinstance(b, RolloutWindow)
                for name in ("logprobs", "values", "bootstrap", "truncated", "last_values"):
                    assert torch.equal(getattr(a, name), getattr(b, name)), name
                for name, tensor in a.forward_inputs.items():
                    assert torch.equal(tensor, b.forward_inputs[name]), name
            else:
                assert isinstance(a, EnvWindow)
                assert isinstance(b, EnvWindow)
                for name in ("rewards", "terminated", "truncated"):
                    assert torch.equal(getattr(a, name), getattr(b, name)), name
