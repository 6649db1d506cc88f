"""Moving weights from the actor to the rollout engines.

- `rlshell.sync.codec`: pure, Ray-free encoders and decoders of weight
  messages: ``bucket`` (every weight in fixed-size flat buckets) and ``patch``
  (only the entries that changed against a snapshot), round-trip tested;
- `rlshell.sync.transfer`: the sender and receiver that carry those messages
  in memory or through the Ray object store.
"""
