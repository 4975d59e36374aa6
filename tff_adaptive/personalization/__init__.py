"""Per-client state between rounds, on the host: `client_state.ClientStateStore`.

What clients of the round engine keep from one round they take part in to the
next (`Recipe.state_keeper`: `extensions/client_state.py`, `private_weights.py`; SCAFFOLD's c_i,
MTFL's batch-norm patches and private Adam moments) goes back to the caller
per client; the training loop keeps it in this store, snapshotted with the
checkpoints (`workflow/training/personalization.py`).
"""
