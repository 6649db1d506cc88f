"""An extension module for the sandbox attack tests: ``run_code``, a reward that runs the
response as Python, as a code-execution reward runs a model's program.

``RLSHELL_EXT_MODULE=reward_exec_ext`` (with this directory on the path) registers it. The
response's code sets ``score`` to 1.0 where its attack succeeded; the reward returns it.
"""

from __future__ import annotations

from rlshell.rewards import register_reward


def run_code(response: str, answer: str) -> float:
    namespace: dict[str, object] = {"score": 0.0}
    exec(response, namespace)  # the point of the reward: the model's code, in its process
    return float(namespace["score"])  # type: ignore[arg-type]


def register() -> None:
    register_reward("run_code", run_code)
