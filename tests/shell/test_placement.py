"""The placement planner: properties over generated clusters first, then hand-computed plans.

The generated requests are valid by construction (every segment inside one
node, counts that divide), so the planner may reject them only for the two
cross-component reasons: a node's CPUs, or GPUs shared with a component that
does not share. A roomy twin of each case (huge CPUs, sharing allowed) must
always plan, and is the oracle for when the real case should fail.
"""

from __future__ import annotations

import doctest
import importlib
import itertools
import json
import pkgutil
import re
from collections import defaultdict
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlshell.cluster.placement
from rlshell.cluster.placement import (
    DEFAULT_NODE_GROUP,
    ClusterSpec,
    ComponentPlan,
    ComponentRequest,
    Mode,
    NodeGroup,
    NodeSpec,
    PlacementError,
    PlacementPlan,
    Segment,
    WorkerPlacement,
    cluster_spec,
    detect_mode,
    format_ranks,
    parse_placement,
    parse_ranks,
    plan_from_dict,
    plan_placement,
    plan_to_dict,
    read_plan,
    render_table,
    simulated_cluster,
    split_component_keys,
    write_plan,
)

NAMES = ("actor", "rollout", "env", "reward")
ROOMY_CPUS = 1e9

# ---------------------------------------------------------------------------
# Strategies


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSpec:
    """1-4 nodes of mixed GPU counts (0 included), sometimes a second node group."""
    nodes = draw(
        st.lists(
            st.builds(
                NodeSpec,
                gpus=st.sampled_from([0, 1, 2, 4, 8]),
                cpus=st.integers(1, 32).map(float),
            ),
            min_size=1,
            max_size=4,
        )
    )
    members = draw(st.lists(st.integers(0, len(nodes) - 1), min_size=1, unique=True))
    groups = {"part": format_ranks(sorted(members))} if draw(st.booleans()) else {}
    return cluster_spec(nodes, groups)


@st.composite
def valid_requests(draw: st.DrawFn, cluster: ClusterSpec, name: str) -> ComponentRequest:
    """A request whose placement is valid in its node group by construction."""
    group = draw(st.sampled_from(cluster.node_groups))
    gpu_counts = [cluster.nodes[node].gpus for node in group.node_ranks]
    uses_gpus = draw(st.sampled_from([True, True, False]))  # GPU holders decide the mode
    on_gpus = uses_gpus and sum(gpu_counts) > 0
    # (first resource rank, resources) of each node of the group
    if on_gpus:
        starts = itertools.accumulate(gpu_counts, initial=0)
        blocks = [(s, n) for s, n in zip(starts, gpu_counts, strict=False) if n]
    else:
        blocks = [(index, 1) for index in range(len(group.node_ranks))]
    tp = draw(st.sampled_from([1, 2, 4])) if on_gpus else 1
    if not any(count >= tp for _, count in blocks):
        tp = 1
    usable = [block for block in blocks if block[1] >= tp]
    chosen = draw(st.lists(st.sampled_from(usable), min_size=1, unique=True))
    pieces, next_rank = [], 0
    for start, count in chosen:
        length = tp * draw(st.integers(1, count // tp))
        first = start + draw(st.integers(0, count - length))
        resources = format_ranks(range(first, first + length))
        shape = draw(st.sampled_from(["implicit", "one", "share", "hold"]))
        if tp > 1:
            processes = length // tp
        elif shape == "share":
            processes = length * draw(st.integers(2, 3))
        elif shape == "hold":
            divisors = [d for d in range(1, length + 1) if length % d == 0]
            processes = length // draw(st.sampled_from(divisors))
        else:
            processes = length
        if shape == "implicit":
            pieces.append(resources)
        else:
            pieces.append(f"{resources}:{format_ranks(range(next_rank, next_rank + processes))}")
        next_rank += processes
    return ComponentRequest(
        name=name,
        placement=",".join(pieces),
        node_group=group.label,
        cpus_per_worker=draw(st.sampled_from([0.25, 0.5, 1.0, 2.0])),
        uses_gpus=uses_gpus,
        tensor_parallel_size=tp,
        shares_devices=draw(st.booleans()),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterSpec, list[ComponentRequest]]:
    cluster = draw(clusters())
    count = draw(st.integers(1, len(NAMES)))
    return cluster, [draw(valid_requests(cluster, name)) for name in NAMES[:count]]


def roomy(
    cluster: ClusterSpec, requests: list[ComponentRequest]
) -> tuple[ClusterSpec, list[ComponentRequest]]:
    """The same case with CPUs to spare and sharing allowed everywhere."""
    nodes = [attrs.evolve(node, cpus=ROOMY_CPUS) for node in cluster.nodes]
    return (
        attrs.evolve(cluster, nodes=nodes),
        [attrs.evolve(request, shares_devices=True) for request in requests],
    )


def attempt(
    cluster: ClusterSpec, requests: list[ComponentRequest]
) -> PlacementPlan | PlacementError:
    """The plan, or the error it raised, for properties that accept either."""
    try:
        return plan_placement(cluster, requests)
    except PlacementError as error:
        return error


def node_cpu_sums(plan: PlacementPlan) -> dict[int, float]:
    sums: dict[int, float] = defaultdict(float)
    for component in plan.components:
        for worker in component.workers:
            sums[worker.node_rank] += worker.cpus
    return sums


def gpu_pairs(workers: tuple[WorkerPlacement, ...]) -> set[tuple[int, int]]:
    return {(worker.node_rank, gpu) for worker in workers for gpu in worker.gpus}


def brute_force_mode(components: tuple[ComponentPlan, ...]) -> Mode:
    holders = [gpu_pairs(c.workers) for c in components if gpu_pairs(c.workers)]
    if not holders:
        holders = [{(w.node_rank, -1) for w in c.workers} for c in components]
    pairs = list(itertools.combinations(holders, 2))
    if all(a == b for a, b in pairs):
        return Mode.COLLOCATED
    if all(not a & b for a, b in pairs):
        return Mode.DISAGGREGATED
    return Mode.HYBRID


# ---------------------------------------------------------------------------
# Properties


@given(scenarios())
def test_generated_plans_keep_every_invariant(
    case: tuple[ClusterSpec, list[ComponentRequest]],
) -> None:
    cluster, requests = roomy(*case)
    plan = plan_placement(cluster, requests)
    assert [c.name for c in plan.components] == [r.name for r in requests]
    for request, component in zip(requests, plan.components, strict=True):
        group = cluster.node_group(request.node_group)
        workers = component.workers
        assert [w.rank for w in workers] == list(range(len(workers)))
        local: dict[int, list[WorkerPlacement]] = defaultdict(list)
        for worker in workers:
            assert worker.node_rank in group.node_ranks
            assert worker.cpus == request.cpus_per_worker
            assert all(0 <= gpu < cluster.nodes[worker.node_rank].gpus for gpu in worker.gpus)
            if request.tensor_parallel_size > 1:
                assert len(worker.gpus) == request.tensor_parallel_size
            local[worker.node_rank].append(worker)
        for on_node in local.values():
            assert [w.local_rank for w in on_node] == list(range(len(on_node)))
            assert {w.local_world_size for w in on_node} == {len(on_node)}
    assert plan.mode == brute_force_mode(plan.components) == detect_mode(plan.components)
    assert plan_from_dict(json.loads(json.dumps(plan_to_dict(plan)))) == plan


@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2)), max_size=4, unique=True),
        min_size=1,
        max_size=4,
    )
)
def test_detect_mode_agrees_with_pairwise_comparison(held: list[list[tuple[int, int]]]) -> None:
    """Components built directly from GPU sets (empty: one CPU worker on node 0 or 1)."""
    components = tuple(
        ComponentPlan(
            name=f"c{index}",
            placement="",
            node_group=DEFAULT_NODE_GROUP,
            workers=[
                WorkerPlacement(rank, node, rank, len(pairs), 1.0, (gpu,), ())
                for rank, (node, gpu) in enumerate(pairs)
            ]
            or [WorkerPlacement(0, index % 2, 0, 1, 1.0, (), ())],
        )
        for index, pairs in enumerate(held)
    )
    assert detect_mode(components) == brute_force_mode(components)


@given(scenarios())
def test_valid_requests_fail_only_on_node_cpus_or_exclusive_gpus(
    case: tuple[ClusterSpec, list[ComponentRequest]],
) -> None:
    cluster, requests = case
    reference = plan_placement(*roomy(cluster, requests))
    sums = node_cpu_sums(reference)
    overloaded = any(total > cluster.nodes[node].cpus + 1e-9 for node, total in sums.items())
    exclusive = {r.name for r in requests if not r.shares_devices}
    conflicting = any(
        gpu_pairs(a.workers) & gpu_pairs(b.workers) and {a.name, b.name} & exclusive
        for a, b in itertools.combinations(reference.components, 2)
    )
    outcome = attempt(cluster, requests)
    if isinstance(outcome, PlacementError):
        assert overloaded or conflicting, outcome
        assert all("CPUs" in p or "shares_devices=False" in p for p in outcome.problems)
        assert any("CPUs" in p for p in outcome.problems) == overloaded
    else:
        assert not overloaded
        assert not conflicting
        plan = outcome
        assert plan.components == reference.components
        assert all(
            total <= cluster.nodes[n].cpus + 1e-9 for n, total in node_cpu_sums(plan).items()
        )


@given(
    st.text(alphabet="0123456789-:,al ", max_size=12),
    st.sampled_from(["1x8", "2x4", "2x0", "3x1"]),
    st.integers(1, 3),
)
def test_arbitrary_placement_text_plans_or_raises_placement_error(
    text: str, spec: str, tensor_parallel_size: int
) -> None:
    cluster = simulated_cluster(spec)
    request = ComponentRequest("actor", text, tensor_parallel_size=tensor_parallel_size)
    outcome = attempt(cluster, [request])
    if isinstance(outcome, PlacementError):
        assert outcome.problems
        assert all(problem.startswith("actor: ") for problem in outcome.problems)
    else:
        ranks = [w.rank for w in outcome.component("actor").workers]
        assert ranks == list(range(len(ranks)))
    try:
        segments = parse_placement(text, num_resources=8)
    except ValueError:
        return
    processes = sorted(p for segment in segments for p in segment.processes)
    assert all(segment.resources for segment in segments)
    assert processes  # a parsed placement always has processes (checking them is the planner's)


@given(st.lists(st.integers(0, 40), unique=True).map(sorted).filter(bool))
def test_format_ranks_inverts_parse_ranks(ranks: list[int]) -> None:
    assert parse_ranks(format_ranks(ranks)) == tuple(ranks)


def test_docstring_examples_run() -> None:
    package = rlshell.cluster.placement
    names = {name: getattr(package, name) for name in package.__all__}
    attempted = 0
    for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        results = doctest.testmod(
            importlib.import_module(module.name),
            extraglobs=names,
            optionflags=doctest.NORMALIZE_WHITESPACE,
        )
        assert results.failed == 0, module.name
        attempted += results.attempted
    assert attempted > 10


# ---------------------------------------------------------------------------
# Syntax


def test_parse_ranks_reads_ranges_in_written_order() -> None:
    assert parse_ranks("0-3,5,7-8") == (0, 1, 2, 3, 5, 7, 8)
    assert parse_ranks(" 4 , 0-1 ") == (4, 0, 1)
    assert format_ranks([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty rank list"),
        ("3-1", "runs backwards; did you mean '1-3'"),
        ("a-b", "bad rank 'a-b'"),
        ("-1", "negative rank '-1'"),
        ("0,,1", "stray comma"),
        ("0-2,2", "rank(s) 2 appear more than once"),
        ("0-9999999", "spans more than"),
    ],
)
def test_parse_ranks_rejects_bad_text(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_ranks(text)


def test_parse_placement_numbers_omitted_processes_after_the_highest_so_far() -> None:
    assert parse_placement("0-3:0-7,4-5", num_resources=8) == (
        Segment((0, 1, 2, 3), range(8)),
        Segment((4, 5), (8, 9)),
    )
    assert parse_placement("all", num_resources=3) == (Segment((0, 1, 2), (0, 1, 2)),)
    assert parse_placement("0-7", 8, tensor_parallel_size=2) == (Segment(range(8), range(4)),)
    with pytest.raises(ValueError, match="tensor_parallel_size 3 does not divide the 8"):
        parse_placement("0-7", 8, tensor_parallel_size=3)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty placement"),
        ("0-7:all", "'all' stands only for resources"),
        ("0:1:2", "more than one ':'"),
        ("0-3,", "empty segment"),
        ("0-x", "bad rank '0-x'"),
    ],
)
def test_parse_placement_rejects_bad_syntax(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_placement(text, num_resources=8)


def test_split_component_keys_expands_shared_keys() -> None:
    assert split_component_keys({"actor,rollout": "0-7", "env": "0-3"}) == {
        "actor": "0-7",
        "rollout": "0-7",
        "env": "0-3",
    }
    assert split_component_keys({"actor, rollout": "all"}) == {"actor": "all", "rollout": "all"}


def test_split_component_keys_rejects_a_component_named_twice() -> None:
    with pytest.raises(PlacementError) as raised:
        split_component_keys({"actor,rollout": "0-7", "rollout": "0-3", "env,": "0"})
    problems = raised.value.problems
    assert problems[0].startswith("rollout: placed twice")
    assert "by 'actor,rollout' ('0-7') and by 'rollout' ('0-3')" in problems[0]
    assert "empty component name" in problems[1]


# ---------------------------------------------------------------------------
# Clusters


def test_simulated_clusters() -> None:
    four_by_eight = simulated_cluster("4x8")
    assert four_by_eight.simulated
    assert four_by_eight.nodes == (NodeSpec(gpus=8, cpus=128.0),) * 4
    assert four_by_eight.node_groups == (NodeGroup("all", (0, 1, 2, 3)),)
    assert simulated_cluster("4x8x64").nodes[3] == NodeSpec(gpus=8, cpus=64.0)
    assert simulated_cluster("1x0").nodes == (NodeSpec(gpus=0, cpus=16.0),)
    assert simulated_cluster("2 × 1").nodes == (NodeSpec(gpus=1, cpus=16.0),) * 2
    grouped = simulated_cluster("3x8", {"train": "0-1", "env": "2"})
    assert grouped.node_group("train").node_ranks == (0, 1)


@pytest.mark.parametrize("spec", ["", "4", "0x8", "4x8x", "four x eight", "4x-1"])
def test_simulated_cluster_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="expected NODESxGPUS"):
        simulated_cluster(spec)


def test_cluster_spec_groups_nodes_in_rank_order() -> None:
    nodes = [NodeSpec(8, 128), NodeSpec(8, 128), NodeSpec(0, 32)]
    spec = cluster_spec(nodes, {"cpu": "2", "a800": "1,0"})
    assert [(g.label, g.node_ranks) for g in spec.node_groups] == [
        ("all", (0, 1, 2)),
        ("cpu", (2,)),
        ("a800", (0, 1)),
    ]
    assert not spec.simulated


def test_cluster_spec_reports_every_problem() -> None:
    nodes = [NodeSpec(8, 0), NodeSpec(-1, 8)]
    with pytest.raises(PlacementError) as raised:
        cluster_spec(nodes, {"all": "0", "far": "1-3", "bad": "x", " pad": "0"})
    assert raised.value.problems == [
        "node 0: CPU count must be > 0, got 0",
        "node 1: GPU count must be >= 0, got -1",
        "node group 'all': the label is reserved for the group of every node",
        "node group 'far': node ranks 2-3 are beyond the cluster's 2 nodes (0-1)",
        "node group 'bad': bad rank 'x' in 'x'; expected a rank like '5' "
        "or an inclusive range like '0-7'",
        "node group ' pad': labels must be non-empty, without outer spaces",
    ]


def test_node_group_lookup_suggests_close_labels() -> None:
    spec = simulated_cluster("2x8", {"a800": "0-1"})
    with pytest.raises(KeyError, match=r"did you mean 'a800'"):
        spec.node_group("a80")
    # A hand-built spec without groups still has "all".
    bare = ClusterSpec(nodes=[NodeSpec(2, 8)])
    assert bare.node_group(DEFAULT_NODE_GROUP).node_ranks == (0,)


# ---------------------------------------------------------------------------
# Hand-computed plans


def test_one_cpu_node_collocates_everything() -> None:
    cluster = cluster_spec([NodeSpec(gpus=0, cpus=2)])
    placements = split_component_keys({"actor,rollout": "0:0-1", "reward": "0"})
    cpus = {"actor": 0.5, "rollout": 0.25, "reward": 0.5}  # 1 + 0.5 + 0.5: exactly 2
    requests = [ComponentRequest(n, p, cpus_per_worker=cpus[n]) for n, p in placements.items()]
    plan = plan_placement(cluster, requests)
    assert plan.component("actor").workers == (
        WorkerPlacement(0, 0, 0, 2, 0.5, (), (0,)),
        WorkerPlacement(1, 0, 1, 2, 0.5, (), (0,)),
    )
    assert plan.component("reward").workers == (WorkerPlacement(0, 0, 0, 1, 0.5, (), (0,)),)
    assert plan.mode == Mode.COLLOCATED


def test_one_node_of_eight_gpus() -> None:
    cluster = simulated_cluster("1x8")
    placements = split_component_keys({"actor,rollout": "0-7"})
    plan = plan_placement(cluster, [ComponentRequest(n, p) for n, p in placements.items()])
    assert plan.mode == Mode.COLLOCATED
    for name in ("actor", "rollout"):
        workers = plan.component(name).workers
        assert [(w.rank, w.local_rank, w.gpus) for w in workers] == [(i, i, (i,)) for i in range(8)]
        assert {w.local_world_size for w in workers} == {8}

    tp = plan_placement(cluster, [ComponentRequest("rollout", "0-7", tensor_parallel_size=2)])
    rollout = tp.component("rollout").workers
    assert [w.cuda_visible_devices for w in rollout] == ["0,1", "2,3", "4,5", "6,7"]
    assert [w.resources for w in rollout] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_four_nodes_of_eight_gpus() -> None:
    cluster = simulated_cluster("4x8")
    actor = plan_placement(cluster, [ComponentRequest("actor", "all")]).component("actor")
    assert actor.world_size == 32
    for worker in actor.workers:
        assert (worker.node_rank, worker.local_rank) == (worker.rank // 8, worker.rank % 8)
        assert worker.gpus == (worker.rank % 8,)

    split = [ComponentRequest("actor", "0-15"), ComponentRequest("rollout", "16-31")]
    disaggregated = plan_placement(cluster, split)
    assert disaggregated.mode == Mode.DISAGGREGATED
    rollout = disaggregated.component("rollout").workers
    assert (rollout[0].node_rank, rollout[0].gpus, rollout[-1].node_rank) == (2, (0,), 3)

    hybrid = [
        ComponentRequest("env", "0-3"),
        ComponentRequest("rollout", "4-7"),
        ComponentRequest("actor", "0-7"),
    ]
    plan = plan_placement(cluster, hybrid)
    assert plan.mode == Mode.HYBRID
    assert plan.component("rollout").workers[0].gpus == (4,)


def test_two_node_groups() -> None:
    nodes = [NodeSpec(8, 128), NodeSpec(8, 128), NodeSpec(0, 64)]
    cluster = cluster_spec(nodes, {"a800": "0-1", "cpu": "2"})
    requests = [
        ComponentRequest("env", "0:0-3", node_group="cpu"),
        ComponentRequest("actor", "0-15", node_group="a800"),
    ]
    plan = plan_placement(cluster, requests)
    env = plan.component("env")
    assert env.node_group == "cpu"
    assert [(w.node_rank, w.local_rank, w.gpus, w.node_group) for w in env.workers] == [
        (2, i, (), "cpu") for i in range(4)
    ]
    actor = plan.component("actor").workers
    assert [(w.node_rank, w.gpus) for w in actor] == [(i // 8, (i % 8,)) for i in range(16)]
    assert plan.mode == Mode.COLLOCATED  # only the actor holds GPUs


def test_processes_sharing_a_gpu_and_holding_several() -> None:
    cluster = simulated_cluster("1x8")
    shared = plan_placement(cluster, [ComponentRequest("env", "0-3:0-7")]).component("env")
    assert [w.gpus for w in shared.workers] == [(i // 2,) for i in range(8)]
    held = plan_placement(cluster, [ComponentRequest("rollout", "0-7:0-1")]).component("rollout")
    assert [w.gpus for w in held.workers] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    with_tp = plan_placement(cluster, [ComponentRequest("r", "0-7:0-1", tensor_parallel_size=4)])
    assert with_tp.component("r").workers == held.workers


def test_gpu_component_asking_for_nodes_gets_whole_nodes() -> None:
    plan = plan_placement(
        simulated_cluster("2x8"), [ComponentRequest("reward", "0-1", uses_gpus=False)]
    )
    workers = plan.component("reward").workers
    assert [(w.node_rank, w.gpus, w.resources) for w in workers] == [(0, (), (0,)), (1, (), (1,))]


# ---------------------------------------------------------------------------
# Errors: each names the component and the key figure


def problems_of(cluster: ClusterSpec, *requests: ComponentRequest) -> list[str]:
    with pytest.raises(PlacementError) as raised:
        plan_placement(cluster, requests)
    return raised.value.problems


def test_unknown_node_group_suggests_the_closest() -> None:
    cluster = simulated_cluster("2x8", {"a800": "0-1"})
    assert problems_of(cluster, ComponentRequest("actor", "0-7", node_group="a80")) == [
        "actor: unknown node group 'a80' (did you mean 'a800'?); the cluster has all, a800"
    ]


@pytest.mark.parametrize(
    ("placement", "says"),
    [
        ("3-1", "range '3-1' in '3-1' runs backwards"),
        ("0-a", "bad rank '0-a'"),
        ("0-7:all", "'all' stands only for resources"),
        ("", "empty placement"),
    ],
)
def test_syntax_errors_name_the_component(placement: str, says: str) -> None:
    [problem] = problems_of(simulated_cluster("1x8"), ComponentRequest("actor", placement))
    assert problem.startswith("actor: ")
    assert says in problem


def test_ranks_beyond_the_node_group() -> None:
    cluster = simulated_cluster("1x8")
    assert problems_of(cluster, ComponentRequest("rollout", "0-15")) == [
        "rollout: placement '0-15' names GPUs 8-15 but node group 'all' has 8 GPUs (1 node × 8)"
    ]
    mixed = cluster_spec([NodeSpec(8, 128), NodeSpec(4, 64), NodeSpec(0, 16)], {"cpu": "2"})
    assert problems_of(mixed, ComponentRequest("actor", "12")) == [
        "actor: placement '12' names GPU 12 but node group 'all' has 12 GPUs "
        "(nodes 0-2 with 8, 4, 0)"
    ]
    assert problems_of(mixed, ComponentRequest("env", "0-1", node_group="cpu")) == [
        "env: placement '0-1' names node 1 but node group 'cpu' has 1 node (node 2)"
    ]


def test_process_ranks_must_run_from_zero_each_once() -> None:
    cluster = simulated_cluster("1x8")
    assert problems_of(cluster, ComponentRequest("actor", "0-3:0-3,4-7:0-3")) == [
        "actor: process ranks of placement '0-3:0-3,4-7:0-3' repeat 0-3; each rank must appear once"
    ]
    assert problems_of(cluster, ComponentRequest("actor", "0-3:0-3,4-7:8-11")) == [
        "actor: process ranks of placement '0-3:0-3,4-7:8-11' are 0-3,8-11; they must be 0-7, "
        "without gaps"
    ]


def test_counts_in_a_segment_must_divide() -> None:
    [problem] = problems_of(simulated_cluster("1x8"), ComponentRequest("env", "0-3:0-2,4-7"))
    assert problem.startswith(
        "env: segment '0-3:0-2' of placement '0-3:0-2,4-7' has 4 GPUs and 3 processes; "
        "one count must be a multiple of the other"
    )


def test_a_process_stays_on_one_node() -> None:
    aligned = plan_placement(simulated_cluster("2x8"), [ComponentRequest("actor", "4-11:0-1")])
    assert [(w.node_rank, w.gpus) for w in aligned.component("actor").workers] == [
        (0, (4, 5, 6, 7)),
        (1, (0, 1, 2, 3)),
    ]
    [gpus] = problems_of(simulated_cluster("2x8"), ComponentRequest("actor", "6-9:0"))
    assert gpus == (
        "actor: placement '6-9:0': process 0 would hold GPUs 6-9 on nodes 0-1; "
        "a process's GPUs must all be on one node"
    )
    [nodes] = problems_of(simulated_cluster("2x0"), ComponentRequest("env", "0-1:0"))
    assert (
        nodes
        == "env: placement '0-1:0': process 0 would span nodes 0-1; a process runs on one node"
    )


def test_tensor_parallel_size() -> None:
    cluster = simulated_cluster("1x8")
    assert problems_of(cluster, ComponentRequest("rollout", "0-7", tensor_parallel_size=3)) == [
        "rollout: tensor_parallel_size 3 does not divide the 8 GPUs of placement '0-7'"
    ]
    assert problems_of(cluster, ComponentRequest("rollout", "0-7:0-7", tensor_parallel_size=2)) == [
        "rollout: placement '0-7:0-7' gives its 8 processes 8 GPUs, but tensor_parallel_size 2 "
        "needs 16 (exactly 2 per process)"
    ]
    [cpu_group] = problems_of(
        simulated_cluster("1x0"), ComponentRequest("rollout", "0", tensor_parallel_size=2)
    )
    assert cpu_group.startswith(
        "rollout: tensor_parallel_size 2 needs GPUs, but node group 'all' has no GPUs"
    )
    [no_gpus] = problems_of(
        cluster, ComponentRequest("rollout", "0", uses_gpus=False, tensor_parallel_size=2)
    )
    assert "tensor_parallel_size 2 needs GPUs, but uses_gpus is False" in no_gpus
    [zero] = problems_of(cluster, ComponentRequest("rollout", "0", tensor_parallel_size=0))
    assert zero == "rollout: tensor_parallel_size must be >= 1, got 0"


@pytest.mark.parametrize("cpus", [0.0, -1.0])
def test_cpus_per_worker_must_be_positive(cpus: float) -> None:
    request = ComponentRequest("reward", "0", cpus_per_worker=cpus)
    assert problems_of(simulated_cluster("1x8"), request) == [
        f"reward: cpus_per_worker must be > 0, got {cpus}"
    ]


def test_node_cpus_must_fit_every_component_on_the_node() -> None:
    cluster = cluster_spec([NodeSpec(gpus=0, cpus=2)])
    requests = [
        ComponentRequest("actor", "0:0-1", cpus_per_worker=0.5),
        ComponentRequest("rollout", "0:0-1", cpus_per_worker=0.5),
        ComponentRequest("reward", "0", cpus_per_worker=0.5),
    ]
    assert problems_of(cluster, *requests) == [
        "actor, rollout, reward: node 0 has 2 CPUs but its workers ask for 2.5 "
        "(actor 2 × 0.5, rollout 2 × 0.5, reward 1 × 0.5); lower cpus_per_worker or move "
        "workers to other nodes"
    ]


def test_exclusive_components_share_no_gpu() -> None:
    cluster = simulated_cluster("2x8")
    requests = [
        ComponentRequest("actor", "0-11", shares_devices=False),
        ComponentRequest("rollout", "6-15"),
    ]
    assert problems_of(cluster, *requests) == [
        "actor, rollout: both use GPUs 6-7 on node 0; 0-3 on node 1, but actor has "
        "shares_devices=False; give them disjoint GPUs or allow sharing"
    ]
    # Its own processes may share a GPU, and CPU-only workers may share a node.
    alone = plan_placement(cluster, [ComponentRequest("env", "0-3:0-7", shares_devices=False)])
    assert alone.component("env").world_size == 8
    cpu_only = [
        ComponentRequest("env", "0-1", uses_gpus=False, shares_devices=False),
        ComponentRequest("reward", "0-1", uses_gpus=False, shares_devices=False),
    ]
    assert plan_placement(cluster, cpu_only).mode == Mode.COLLOCATED


def test_component_names_are_unique_and_single() -> None:
    cluster = simulated_cluster("1x8")
    assert problems_of(
        cluster, ComponentRequest("actor", "0-3"), ComponentRequest("actor", "4-7")
    ) == ["actor: requested 2 times; each component is planned once"]
    [problem] = problems_of(cluster, ComponentRequest("actor,rollout", "0-7"))
    assert "split_component_keys" in problem


def test_every_problem_is_reported_at_once() -> None:
    cluster = simulated_cluster("2x8x4")
    problems = problems_of(
        cluster,
        ComponentRequest("actor", "0-7", shares_devices=False),
        ComponentRequest("rollout", "0-7", tensor_parallel_size=3),
        ComponentRequest("env", "0-3", node_group="gpu"),
        ComponentRequest("ref", "0-31"),
        ComponentRequest("critic", "0-7", cpus_per_worker=0),
        ComponentRequest("reward", "0-7"),
    )
    assert [problem.split(":")[0] for problem in problems] == [
        "rollout",
        "env",
        "ref",
        "critic",
        "actor, critic, reward",
        "actor, critic",
        "actor, reward",
    ]


# ---------------------------------------------------------------------------
# Rendering and files


HYBRID_4X8 = [
    ComponentRequest("env", "0-15"),
    ComponentRequest("rollout", "16-31", tensor_parallel_size=2),
    ComponentRequest("actor", "all"),
    ComponentRequest("reward", "0-3", uses_gpus=False, cpus_per_worker=4),
]

HYBRID_4X8_TABLE = """\
cluster: 4 nodes × 8 GPUs, 128 CPUs each (simulated) · mode: hybrid
component  ranks  node  local ranks  GPUs                     CPUs/worker
---------  -----  ----  -----------  -----------------------  -----------
env        0-7    0     0-7          0-7                      1
env        8-15   1     0-7          0-7                      1
rollout    0-3    2     0-3          [0-1] [2-3] [4-5] [6-7]  1
rollout    4-7    3     0-3          [0-1] [2-3] [4-5] [6-7]  1
actor      0-7    0     0-7          0-7                      1
actor      8-15   1     0-7          0-7                      1
actor      16-23  2     0-7          0-7                      1
actor      24-31  3     0-7          0-7                      1
reward     0      0     0            -                        4
reward     1      1     0            -                        4
reward     2      2     0            -                        4
reward     3      3     0            -                        4"""


def test_render_table_for_a_hybrid_four_by_eight_plan() -> None:
    table = render_table(plan_placement(simulated_cluster("4x8"), HYBRID_4X8))
    assert table == HYBRID_4X8_TABLE
    assert max(len(line) for line in table.splitlines()) <= 100


def test_render_table_shows_groups_and_shared_gpus() -> None:
    nodes = [NodeSpec(8, 128), NodeSpec(0, 16)]
    cluster = cluster_spec(nodes, {"gpu": "0", "cpu": "1"})
    requests = [
        ComponentRequest("env", "0-3:0-7", node_group="gpu"),
        ComponentRequest("rollout", "0-7:0-1", node_group="gpu"),
        ComponentRequest("reward", "0:0-1", node_group="cpu", cpus_per_worker=0.5),
    ]
    assert render_table(plan_placement(cluster, requests)).splitlines() == [
        "cluster: 1 node × 8 GPUs, 128 CPUs + 1 CPU-only node, 16 CPUs · mode: hybrid",
        "node groups: gpu = node 0 · cpu = node 1",
        "component  ranks  node  local ranks  GPUs                  CPUs/worker",
        "---------  -----  ----  -----------  --------------------  -----------",
        "env        0-7    0     0-7          0-3 (2 workers each)  1",
        "rollout    0-1    0     0-1          [0-3] [4-7]           1",
        "reward     0-1    1     0-1          -                     0.5",
    ]


def test_plans_round_trip_through_json_files(tmp_path: Path) -> None:
    plan = plan_placement(simulated_cluster("4x8"), HYBRID_4X8)
    data = plan_to_dict(plan)
    assert list(data) == ["cluster", "components", "mode"]
    assert data["mode"] == "hybrid"
    assert plan_from_dict(json.loads(json.dumps(data))) == plan
    written = write_plan(plan, tmp_path / "run" / "plan.json")
    assert written == tmp_path / "run" / "plan.json"
    assert json.loads(written.read_text()) == data
    assert written.read_text() == json.dumps(data, indent=2) + "\n"
    assert write_plan(plan, tmp_path) == tmp_path / "placement.json"
    assert read_plan(tmp_path) == read_plan(written) == plan


def test_plan_lookup_names_the_planned_components() -> None:
    plan = plan_placement(simulated_cluster("1x8"), [ComponentRequest("actor", "0-7")])
    with pytest.raises(KeyError, match=r"no component 'critic'.*planned: actor"):
        plan.component("critic")
