"""How the planner's messages count and name things."""

from __future__ import annotations

from collections.abc import Sequence

from rlshell.cluster.placement.syntax import format_ranks

__all__: list[str] = []


def counted(count: int, noun: str) -> str:
    plural = "es" if noun.endswith("s") else "s"
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{plural}"


def plain_number(value: float) -> str:
    """CPU figures without a spurious ".0": 2 → "2", 0.5 → "0.5"."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def nodes_label(node_ranks: Sequence[int]) -> str:
    noun = "node" if len(node_ranks) == 1 else "nodes"
    return f"{noun} {format_ranks(node_ranks)}"
