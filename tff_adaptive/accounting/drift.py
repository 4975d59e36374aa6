"""Client drift: the mean pairwise cosine distance between sampled clients' uploads.

The FedGBO paper and the thesis (thesis §6.1.2, Fig. 6.1) show
client drift as "the average cosine distance between client models uploaded at
the end of each communication round": with n sampled clients uploading vectors
v_1..v_n, drift = mean over ordered pairs i ≠ j of 1 − cos(v_i, v_j). The
larger FedGBO's β, the more the fixed global momentum dominates the local
steps, and the smaller the drift.

Pairwise distances need every upload at once, but with unit vectors
u_i = v_i/‖v_i‖ they follow from one sum:

  ‖Σ_i u_i‖² = Σ_i ‖u_i‖² + Σ_{i≠j} u_i·u_j = n + Σ_{i≠j} cos(v_i, v_j),

so mean_{i≠j} cos(v_i, v_j) = (‖Σ u_i‖² − n) / (n(n−1)), and the drift is one
minus that. Each client therefore sends u_i and the server only needs
`tff.federated_sum` of them (and of the count): the composer measures drift
this way (`build_process(..., measure_client_drift=True)`) without collecting
per-client uploads.

Two variants are measured, because the papers' "uploaded models" are
ambiguous: `delta` uses v_i = Δ_i = x_t − y_K^i (what FedAvg-style algorithms
upload; independent of the shared starting point x_t), `model` uses
v_i = y_K^i, the client's trainable weights at the end of the round (what
FedGBO uploads). Model distances are much smaller, since every y_K^i is close
to the same x_t. Sums are taken in float64: the model variant subtracts two
numbers close to n², which float32 would round away.

A client whose vector is zero (no data, or a non-finite update zeroed by the
composer) has no direction; it is left out of both the sum and n. With fewer
than two counted clients the drift is undefined (NaN).

This is a simulation diagnostic: a real deployment would have to upload u_i
(|x| more floats per client for each variant); these extra uploads are NOT
counted in the `cost/` bits.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf


def unit_vector(tensors: Sequence[tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
  """(u, counted): the tensors flattened, concatenated, as a float64 unit vector.

  A zero (or non-finite) vector gives u = 0 and counted = 0, so that it adds
  nothing to Σ u_i nor to n.
  """
  flat = tf.concat([tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tensors], axis=0)
  # axis=0, not tf.norm's default: that squeezes every size-1 axis, and
  # under tf.vectorized_map (the cohort program) a shard of one client has a
  # client axis of size 1, which it removed too (counted became a scalar).
  norm = tf.norm(flat, axis=0)
  counted = tf.logical_and(norm > 0.0, tf.math.is_finite(norm))
  u = tf.where(counted, flat / tf.where(counted, norm, tf.ones_like(norm)), tf.zeros_like(flat))
  return u, tf.cast(counted, tf.float64)


def mean_cosine_similarity_from_sum(sum_of_units: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
  """mean_{i≠j} cos(v_i, v_j) = (‖Σ u_i‖² − n) / (n(n−1)); NaN when n < 2."""
  sum_of_units = tf.cast(sum_of_units, tf.float64)
  n = tf.cast(n, tf.float64)
  squared = tf.reduce_sum(tf.square(sum_of_units))
  pairs = n * (n - 1.0)
  return tf.where(n >= 2.0, (squared - n) / tf.where(n >= 2.0, pairs, tf.ones_like(pairs)),
                  tf.constant(np.nan, tf.float64))


def mean_cosine_distance_from_sum(sum_of_units: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
  """Client drift: mean_{i≠j} (1 − cos(v_i, v_j)) from Σ u_i and n; NaN when n < 2."""
  return 1.0 - mean_cosine_similarity_from_sum(sum_of_units, n)


def pairwise_cosine_distance_numpy(vectors: Sequence[np.ndarray]) -> float:
  """Reference: the mean of 1 − cos over all ordered pairs i ≠ j, computed pair by pair.

  Zero vectors are left out, as in the federated computation.
  """
  flat = [np.asarray(v, np.float64).reshape(-1) for v in vectors]
  flat = [v for v in flat if np.linalg.norm(v) > 0]
  n = len(flat)
  if n < 2:
    return float('nan')
  total = 0.0
  for i in range(n):
    for j in range(n):
      if i != j:
        total += 1.0 - flat[i] @ flat[j] / (np.linalg.norm(flat[i]) * np.linalg.norm(flat[j]))
  return total / (n * (n - 1))
