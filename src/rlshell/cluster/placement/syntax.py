"""RLinf's placement syntax: rank ranges, placement strings, component keys, node selectors."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from attrs import frozen

from rlshell.cluster.placement.records import DEFAULT_NODE_GROUP, PlacementError, Segment

__all__ = [
    "format_ranks",
    "label_selector",
    "parse_node_ranks",
    "parse_placement",
    "parse_ranks",
    "split_component_keys",
]


_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


_NEGATIVE = re.compile(r"-[0-9]+(?:-[0-9]+)?")


_MAX_RANKS = 1_000_000


def parse_ranks(text: str) -> tuple[int, ...]:
    """Ranks from RLinf's range syntax, in the order written; ranges are inclusive.

    >>> parse_ranks("0-3,5,7-8")
    (0, 1, 2, 3, 5, 7, 8)

    A ValueError names the offending part: empty text, a non-number, a
    negative rank, a range that runs backwards (``"3-1"``), a repeated rank.
    """
    if not text.strip():
        raise ValueError("empty rank list; expected ranks like '0-3,5'")
    ranks = [rank for part in text.split(",") for rank in _parse_range(part.strip(), text)]
    repeated = sorted(rank for rank, count in Counter(ranks).items() if count > 1)
    if repeated:
        raise ValueError(f"rank(s) {format_ranks(repeated)} appear more than once in '{text}'")
    return tuple(ranks)


def _parse_range(part: str, text: str) -> range:
    match = _RANGE.fullmatch(part)
    if match is None:
        if not part:
            raise ValueError(f"empty part in ranks '{text}' (a stray comma?)")
        if _NEGATIVE.fullmatch(part):
            raise ValueError(f"negative rank '{part}' in '{text}'; ranks count from 0")
        raise ValueError(
            f"bad rank '{part}' in '{text}'; expected a rank like '5' "
            "or an inclusive range like '0-7'"
        )
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    if last < first:
        raise ValueError(
            f"range '{part}' in '{text}' runs backwards; did you mean '{last}-{first}'?"
        )
    # A typo such as "0-70000000" would otherwise build a huge tuple before any range check.
    if last - first >= _MAX_RANKS:
        raise ValueError(f"range '{part}' in '{text}' spans more than {_MAX_RANKS} ranks")
    return range(first, last + 1)


def format_ranks(ranks: Iterable[int]) -> str:
    """The inverse of `parse_ranks`: runs of consecutive ranks become ranges.

    >>> format_ranks([0, 1, 2, 3, 5, 7, 8])
    '0-3,5,7-8'
    """
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


@frozen
class ParsedSegment:
    """A segment as written: ``processes`` is None when the process ranks were left out."""

    text: str
    resources: tuple[int, ...]
    processes: tuple[int, ...] | None


def parse_placement(
    text: str, num_resources: int, *, tensor_parallel_size: int = 1
) -> tuple[Segment, ...]:
    """The segments of a placement string; ``"all"`` means resources ``0..num_resources-1``.

    >>> parse_placement("0-3:0-7,4-5", num_resources=8)
    (Segment(resources=(0, 1, 2, 3), processes=(0, 1, 2, 3, 4, 5, 6, 7)),
     Segment(resources=(4, 5), processes=(8, 9)))

    A segment without process ranks gets the next ranks after the highest so
    far, one process per ``tensor_parallel_size`` resources. Only the syntax
    is checked here (ValueError); `plan_placement` checks the ranks against
    a cluster.
    """
    segments = parse_segments(text, num_resources)
    for segment in uneven_segments(segments, tensor_parallel_size):
        raise ValueError(
            f"tensor_parallel_size {tensor_parallel_size} does not divide the "
            f"{len(segment.resources)} resources of {segment_name(segment, text)}"
        )
    return number_processes(segments, tensor_parallel_size)


def parse_segments(text: str, num_resources: int) -> tuple[ParsedSegment, ...]:
    if not text.strip():
        raise ValueError("empty placement; expected e.g. '0-7', '0-3:0-7' or 'all'")
    try:
        return tuple(_parse_segment(part.strip(), num_resources) for part in text.split(","))
    except ValueError as error:
        raise ValueError(f"placement '{text}': {error}") from None


def _parse_segment(text: str, num_resources: int) -> ParsedSegment:
    if not text:
        raise ValueError("empty segment (a stray comma?)")
    resource_text, colon, process_text = (part.strip() for part in text.partition(":"))
    if ":" in process_text:
        raise ValueError(f"segment '{text}' has more than one ':'")
    if resource_text == "all":
        if num_resources < 1:
            raise ValueError(f"segment '{text}': 'all' names no resources here")
        resources = tuple(range(num_resources))
    else:
        resources = parse_ranks(resource_text)
    if not colon:
        return ParsedSegment(text, resources, None)
    if process_text == "all":
        raise ValueError(
            f"segment '{text}': 'all' stands only for resources; write process ranks, e.g. "
            f"'{resource_text}:0-{max(len(resources), 1) - 1}'"
        )
    return ParsedSegment(text, resources, parse_ranks(process_text))


def uneven_segments(segments: Sequence[ParsedSegment], per_process: int) -> list[ParsedSegment]:
    """Segments without process ranks whose resources do not split into per_process blocks."""
    return [s for s in segments if s.processes is None and len(s.resources) % per_process]


def number_processes(segments: Sequence[ParsedSegment], per_process: int) -> tuple[Segment, ...]:
    numbered: list[Segment] = []
    next_rank = 0
    for segment in segments:
        processes = segment.processes
        if processes is None:
            count = max(len(segment.resources) // per_process, 1)
            processes = tuple(range(next_rank, next_rank + count))
        next_rank = max(next_rank, max(processes, default=-1) + 1)
        numbered.append(Segment(segment.resources, processes))
    return tuple(numbered)


def segment_name(segment: ParsedSegment, placement: str) -> str:
    if segment.text == placement.strip():
        return f"placement '{placement}'"
    return f"segment '{segment.text}' of placement '{placement}'"


def split_component_keys(mapping: Mapping[str, str]) -> dict[str, str]:
    """One entry per component from RLinf's placement mapping, where keys may name several.

    >>> split_component_keys({"actor,rollout": "0-7", "env": "0-3"})
    {'actor': '0-7', 'rollout': '0-7', 'env': '0-3'}

    A component named twice, or an empty name, is a PlacementError.
    """
    split: dict[str, str] = {}
    first_key: dict[str, str] = {}
    problems: list[str] = []
    for key, placement in mapping.items():
        for name in (part.strip() for part in key.split(",")):
            if not name:
                problems.append(f"'{key}': empty component name (a stray comma?)")
            elif name in split:
                problems.append(
                    f"{name}: placed twice, by '{first_key[name]}' ('{split[name]}') "
                    f"and by '{key}' ('{placement}'); name each component once"
                )
            else:
                split[name] = placement
                first_key[name] = key
    if problems:
        raise PlacementError(problems)
    return split


def label_selector(text: str) -> tuple[str, str] | None:
    """``("pool", "cpu")`` from a node group given as a Ray node label, ``"pool=cpu"``;
    None for node ranks (``"1-2"``)."""
    key, equals, value = text.partition("=")
    if not equals:
        return None
    if not key.strip() or not value.strip():
        raise ValueError(f"'{text}' is neither node ranks nor a label like 'pool=cpu'")
    return key.strip(), value.strip()


def parse_node_ranks(text: str, node_count: int, label: str = "") -> tuple[int, ...]:
    """Node ranks from ``"0-1,3"`` (or ``"all"``), checked against ``node_count``.

    ``label`` names the node group in errors.
    """
    where = f"node group '{label}'" if label else "node ranks"
    if text.strip() == DEFAULT_NODE_GROUP:
        return tuple(range(node_count))
    ranks: list[int] = []
    for part in (piece.strip() for piece in text.split(",")):
        low_text, _, high_text = part.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if high_text else low
        except ValueError:
            raise ValueError(
                f"{where}: '{part}' in '{text}' is not a node rank or range like '0-3'"
            ) from None
        if low > high:
            raise ValueError(f"{where}: range '{part}' in '{text}' runs backwards")
        ranks.extend(range(low, high + 1))
    outside = sorted(rank for rank in set(ranks) if not 0 <= rank < node_count)
    if outside:
        raise ValueError(
            f"{where}: node ranks {outside} in '{text}' do not exist; "
            f"the cluster has nodes 0-{node_count - 1}"
        )
    repeated = sorted({rank for rank in ranks if ranks.count(rank) > 1})
    if repeated:
        raise ValueError(f"{where}: node ranks {repeated} appear twice in '{text}'")
    return tuple(ranks)
