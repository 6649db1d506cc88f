"""JAX twins of rlcore's torch maths, jit-compatible.

`rlcore.jax.masked`, `rlcore.jax.advantages`, `rlcore.jax.losses`,
`rlcore.jax.logprobs`, `rlcore.jax.distributions` and `rlcore.jax.normalize`
have the names, arguments, defaults and semantics of their torch namesakes
over `jax.Array` s (the samplers take a JAX key for torch's generator), and a
differential test suite (tests/core/test_jax_*.py) checks that both agree on
hypothesis-generated inputs, values and gradients. Results are pytree records
(`Advantages`, `LossOutput`, `TokenStats`, `RunningStats`).

Python-scalar hyperparameters (``gamma``, ``clip_low``, ``agg``, ``kind``,
``chunk_size``...) must be static under `jax.jit`; `jit` marks them::

    ppo = rlcore.jax.jit(rlcore.jax.losses.ppo_policy_loss)

`import rlcore` never imports this package (nor jax).
"""

from rlcore.jax import advantages, distributions, logprobs, losses, masked, normalize, types
from rlcore.jax._jit import jit, static_argnames
from rlcore.jax.logprobs import TokenStats
from rlcore.jax.normalize import RunningStats
from rlcore.jax.types import Advantages, LossOutput

__all__ = [
    "Advantages",
    "LossOutput",
    "RunningStats",
    "TokenStats",
    "advantages",
    "distributions",
    "jit",
    "logprobs",
    "losses",
    "masked",
    "normalize",
    "static_argnames",
    "types",
]
