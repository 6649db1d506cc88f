"""Confidence intervals for evaluation figures: Student's t on a mean, Wilson on a rate.

Plain floats in and out (an evaluation has tens to thousands of episodes);
no scipy: the t quantile inverts the exact closed-form distribution
function for integer degrees of freedom (Abramowitz & Stegun 26.7.3–4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

__all__ = ["student_t_interval", "student_t_quantile", "wilson_interval"]


def _two_sided_t_probability(t: float, df: int, coefficients: np.ndarray) -> float:
    """A(t | ν) = P(|T| ≤ t) for T ~ Student's t with ν = ``df`` (t ≥ 0).

    With θ = arctan(t / √ν):
    ν odd:  A = (2/π) [θ + sin θ Σⱼ cⱼ cosʲ θ],  j = 1, 3, …, ν − 2 (no sum for ν = 1)
    ν even: A = sin θ Σⱼ cⱼ cosʲ θ,              j = 0, 2, …, ν − 2
    with c at the first j equal to 1 and c_{j+2} = c_j (j + 1)/(j + 2).
    """
    theta = math.atan(t / math.sqrt(df))
    cos, sin = math.cos(theta), math.sin(theta)
    first = 1 if df % 2 else 0
    powers = np.power(cos, np.arange(first, df - 1, 2, dtype=np.float64))
    series = float(np.dot(coefficients, powers)) if coefficients.size else 0.0
    if df % 2:
        return 2.0 / math.pi * (theta + sin * series)
    return sin * series


def _series_coefficients(df: int) -> np.ndarray:
    first = 1 if df % 2 else 0
    exponents = np.arange(first, df - 1, 2, dtype=np.float64)
    if exponents.size == 0:
        return exponents
    ratios = (exponents[:-1] + 1.0) / (exponents[:-1] + 2.0)
    return np.concatenate(([1.0], np.cumprod(ratios)))


def student_t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile of Student's t with ``df`` degrees of freedom (0.5 < p < 1).

    Found by bisection on the exact two-sided probability A(t | ν) = 2p − 1,
    to a relative tolerance of 1e-12. ``student_t_quantile(0.975, 9)`` is 2.2622.
    """
    if not 0.5 < probability < 1.0:
        raise ValueError(f"probability must lie in (0.5, 1), got {probability}")
    if df < 1:
        raise ValueError(f"df must be a positive int, got {df}")
    target = 2.0 * probability - 1.0
    coefficients = _series_coefficients(df)
    low, high = 0.0, 1.0
    while _two_sided_t_probability(high, df, coefficients) < target:
        low, high = high, high * 2.0
    while high - low > 1e-12 * high:
        middle = 0.5 * (low + high)
        if _two_sided_t_probability(middle, df, coefficients) < target:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def student_t_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float] | None:
    """x̄ ± t_{(1+c)/2, n−1} · s/√n: the t interval on the mean of ``values``.

    s is the sample standard deviation (n − 1 in the denominator). None for
    fewer than two values, where s is undefined.
    """
    count = len(values)
    if count < 2:
        return None
    mean = math.fsum(values) / count
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (count - 1))
    half = student_t_quantile(0.5 + confidence / 2.0, count - 1) * std / math.sqrt(count)
    return mean - half, mean + half


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval for a success rate (Wilson 1927).

    With p̂ = k/n and z the (1 + c)/2 normal quantile:
    (p̂ + z²/2n ± z √(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n).
    Unlike p̂ ± z √(p̂(1 − p̂)/n) it stays inside [0, 1] and is not empty at
    0 or n successes.
    """
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    rate = successes / trials
    scale = 1.0 + z * z / trials
    center = (rate + z * z / (2 * trials)) / scale
    half = z / scale * math.sqrt(rate * (1.0 - rate) / trials + z * z / (4 * trials * trials))
    return max(0.0, center - half), min(1.0, center + half)
