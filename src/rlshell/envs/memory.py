"""``env.memory_mb``: an env copy's process with a bound on its address space.

`MemoryLimited` wraps an env in its own process (``env.isolate``; gymnasium's
``make_vec`` applies its wrappers in each copy's process). At the env's first
reset it lets that process's address space grow by at most ``memory_mb`` MiB
from then on (`rlshell.limits.limit_address_space`). An allocation past it
fails the step or reset with a ``MemoryError`` naming the limit, a failure
``env.on_failure`` handles like any other.

The limit is not set when the wrapper is built: ``AsyncVectorEnv`` builds one
copy in its own (the env worker's) process to read the spaces, and closes it
without a reset; a limit set then would bound the worker, torch and all.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium

from rlshell.limits import limit_address_space

__all__ = ["MemoryLimited"]


class MemoryLimited(gymnasium.Wrapper[Any, Any, Any, Any]):
    """``env``, its process's address space let grow by at most ``memory_mb`` MiB from its
    first reset (or step) on."""

    def __init__(self, env: gymnasium.Env[Any, Any], memory_mb: int) -> None:
        super().__init__(env)
        self.memory_mb = memory_mb
        self._limited = False

    def _limit(self) -> None:
        if not self._limited:
            limit_address_space(self.memory_mb)
            self._limited = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        self._limit()
        try:
            return self.env.step(action)
        except MemoryError as error:
            raise self._named(error) from None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._limit()
        try:
            return self.env.reset(seed=seed, options=options)
        except MemoryError as error:
            raise self._named(error) from None

    def _named(self, error: MemoryError) -> MemoryError:
        # A plain MemoryError: AsyncVectorEnv raises the copy's error again in the parent as
        # type(error)(message), which numpy's own subclass cannot be built from.
        return MemoryError(f"{error} (past env.memory_mb={self.memory_mb} MiB of growth)")
