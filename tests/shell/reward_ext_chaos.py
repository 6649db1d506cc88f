"""An extension module for the reward pool tests: ``chaos``, a reward that misbehaves on cue.

``RLSHELL_EXT_MODULE=reward_ext_chaos`` (with this directory on the path)
registers it in every process. It scores exact match unless the response is
a cue: HANG sleeps forever, SPIN loops on the CPU forever, SLOW takes 0.4 s,
BOOM raises, NAN / NONE / TEXT return a bad value, EXIT ends the process, HOG
allocates 1 GiB, ``ENV:NAME`` scores whether the process's environment variable NAME holds
the answer (``unset``: that it has none).

Two more for whole runs: ``always_fails`` raises on every call, and
``every_other`` raises on every other call of its process (the first, the
third, ...) and scores exact match on the rest.
"""

from __future__ import annotations

import os
import time
from typing import cast

from rlshell.rewards import register_reward

SLOW_S = 0.4


def chaos_reward(response: str, answer: str) -> float:
    if response == "HANG":
        time.sleep(10_000)
    if response == "SPIN":
        while True:
            pass
    if response == "SLOW":
        time.sleep(SLOW_S)
        return 1.0
    if response == "BOOM":
        raise ValueError(f"boom on {answer!r}")
    if response == "EXIT":
        os._exit(3)
    if response == "HOG":
        hog = bytearray(1 << 30)  # 1 GiB, past any memory_mb the tests set
        return float(len(hog) > 0)
    if response.startswith("ENV:"):
        return 1.0 if os.environ.get(response.removeprefix("ENV:"), "unset") == answer else 0.0
    bad: dict[str, object] = {"NAN": float("nan"), "NONE": None, "TEXT": "1.0"}
    if response in bad:
        return cast(float, bad[response])
    return 1.0 if response == answer else 0.0


def always_fails(response: str, answer: str) -> float:
    raise RuntimeError(f"no scorer for {answer!r}")


_calls = [0]


def every_other(response: str, answer: str) -> float:
    _calls[0] += 1
    if _calls[0] % 2:
        raise KeyError(f"odd call {_calls[0]}")
    return 1.0 if response == answer else 0.0


def register() -> None:
    register_reward("chaos", chaos_reward)
    register_reward("always_fails", always_fails)
    register_reward("every_other", every_other)
