"""The ``reasoning`` trainer (`ReasoningTrainer`) and the collaborators it composes.

- `trainer`: the step's choreography, evaluation, save and load;
- `groups`: the worker groups, launched together, and the reference's log-probs;
- `generation`: rollout requests dealt over the rollout ranks and merged back;
- `scoring`: rewards, their failure watches, DAPO's shaping and dynamic sampling;
- `kl_penalty`: the KL penalty in the reward and its coefficient β;
- `turns`: the actor and the rollout taking turns on shared GPUs;
- `weight_sync`: the actor's weights to the rollout, synchronous or queued.
"""

from rlshell.runners.reasoning.trainer import ReasoningTrainer

__all__ = ["ReasoningTrainer"]
