"""Personalised FL (thesis ch. 4, docs/algorithms.md#mtfl): MTFL's engine, and the client-state store.

Per-FedAvg and pFedMe are recipes of the round engine (`tff_adaptive.rounds`:
`Recipe.user_accuracy`); MTFL still runs on the engine below, per client.

  process       `PersonalizedProcess`: a learning process whose clients also take
                and return private per-client state (MTFL's private patches);
  recipe        what an algorithm writes: `PatchLayout` (its private weights),
                `LocalRecipe` (its local step), also importable from `process`;
  client_work   one client's work in such a round (patch, user accuracy, steps);
  client_state  `ClientStateStore`: that state on disk, snapshotted with checkpoints.

The algorithms themselves are `tff_adaptive.algorithms.{mtfl,perfedavg,pfedme}`;
the training loop's side (user accuracy, noisy clients) is `workflow.personalization`.
"""
