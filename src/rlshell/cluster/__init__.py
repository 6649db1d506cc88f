"""Where work runs: the placement planner, the Ray cluster, and workers and their groups.

- `rlshell.cluster.placement`: a pure planner (no Ray) from a cluster spec and
  per-component requests to a `PlacementPlan`, in RLinf's placement syntax;
- `rlshell.cluster.ray_cluster`: `Cluster`, an embedded or attached Ray, and
  the placement groups that realise a plan;
- `rlshell.cluster.worker`: `Worker`, the base of every role, and `WorkerGroup`,
  one Ray actor per planned rank called as one, with errors that name the
  component, rank and node.

Nothing here knows about training: roles live in `rlshell.workers`.
"""
