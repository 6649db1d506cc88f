"""An extension module holding one advantage and one policy loss written as RLinf's docs
describe them: keyword arguments, ``**kwargs`` for the rest, tuple returns, registered by
decorator (RLinf: ``from rlinf.algorithms.registry import register_advantage``).

``RLSHELL_EXT_MODULE=rlinf_plugins_ext`` (with this directory on the path) registers them in
every process of a run: the decorators run when the module is imported; ``register()``, which
the extension loader calls, has nothing left to do.

- ``rlinf_sign``: each row's outcome score against its group's mean, as a sign: +1 above,
  −1 below, 0 level. Its advantages are exactly −1, 0 or +1, which no built-in gives, so a
  run can tell they reached the loss.
- ``rlinf_clip``: PPO's clipped surrogate in RLinf's style, reporting ``actor/plugin_called``
  (1 on every call) and ``actor/sign_advantages`` (the share of valid advantages it received
  that are −1, 0 or +1).
"""

from __future__ import annotations

import torch

from rlshell.rlinf_plugins import register_advantage, register_policy_loss


@register_advantage("rlinf_sign")
def compute_sign_advantages(reward_scores, loss_mask, group_size, **kwargs):  # type: ignore[no-untyped-def]
    grouped = reward_scores.view(-1, group_size)
    sign = torch.sign(grouped - grouped.mean(dim=-1, keepdim=True))
    advantages = (torch.zeros_like(loss_mask, dtype=torch.float32) + sign.view(1, -1)) * loss_mask
    return advantages, None


@register_policy_loss("rlinf_clip")
def compute_clipped_actor_loss(  # type: ignore[no-untyped-def]
    logprobs,
    old_logprobs,
    advantages,
    clip_ratio_low,
    clip_ratio_high,
    loss_mask=None,
    loss_agg_func=None,
    **kwargs,
):
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    policy_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio)
    policy_loss = loss_agg_func(policy_loss, loss_mask)
    valid = advantages[loss_mask]
    signs = (valid == 0) | (valid.abs() == 1)
    metrics = {
        "actor/policy_loss": policy_loss.detach(),
        "actor/plugin_called": 1.0,
        "actor/sign_advantages": signs.float().mean().detach(),
    }
    return policy_loss, metrics


def register() -> None:
    """Nothing: the decorators above registered both when this module was imported."""
