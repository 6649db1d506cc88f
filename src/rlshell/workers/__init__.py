"""Ray workers, one module per role, each driving its engines through their protocols.

- reasoning: `actor` (the trained policy on its training backend, with the rollout
  engine collocated where the placement says), `rollout` (an engine in processes of
  its own), `critic`, `reward`, `probe`;
- embodied: `embodied_actor`, `embodied_grpo`, `embodied_pipeline` (env, rollout and
  actor in stages), `embodied_update`, `sac_workers` and `sac_update`;
- shared helpers: `packing` (the hyperparameters each reads are
  `rlshell.hyperparameters`').
"""
