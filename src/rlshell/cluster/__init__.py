"""Where work runs: the placement planner, the Ray cluster, and workers and their groups.

- `rlshell.cluster.placement`: a pure planner (no Ray) from a cluster spec and
  per-component requests to a `PlacementPlan`, in RLinf's placement syntax;
- `rlshell.cluster.ray_cluster`: `Cluster`, an embedded or attached Ray, and
  the placement groups that realise a plan;
- `rlshell.cluster.worker`: `Worker`, the base of every role;
  `rlshell.cluster.worker_base`: what runs in its process (start-up hooks, the
  Ray actor class), which the group builds on;
- `rlshell.cluster.group`: `WorkerGroup`, one Ray actor per planned rank
  called as one (launch, call, gather, time-outs, shutdown);
- `rlshell.cluster.errors`: `WorkerError` and its kinds, naming the component,
  rank, node, pid and method of a failed worker (Ray-free).

`group` imports `worker` and `errors`; `errors` imports neither.

Nothing here knows about training: roles live in `rlshell.workers`.
"""
