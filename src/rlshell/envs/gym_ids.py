"""Gymnasium ids as configs give them (``module:Name-v0``), checked before an env is made."""

from __future__ import annotations

import difflib
import importlib

__all__ = ["check_gymnasium_id"]


def check_gymnasium_id(env_id: str | None, example: str = "CartPole-v1") -> str:
    """``env_id`` without its ``module:`` prefix, after importing that module.

    Raises a ValueError naming ``env.env_id`` when the id is missing or not in
    ``gymnasium.registry`` (with the closest registered ids).
    """
    import gymnasium

    if env_id is None:
        raise ValueError(f"env.env_id: this env type needs a gymnasium id, e.g. {example!r}")
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(
                f"env.env_id {env_id!r}: cannot import module {module!r} ({err})"
            ) from None
    if name not in gymnasium.registry:
        close = difflib.get_close_matches(name, list(gymnasium.registry), n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise ValueError(
            f"env.env_id: unknown gymnasium id {name!r}{hint}; "
            "an id from another package needs its module as a prefix, "
            "e.g. 'gymnasium_robotics:FetchReach-v4'"
        )
    return name
