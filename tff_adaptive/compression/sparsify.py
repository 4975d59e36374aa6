"""Top-(1 - s) sparsification with shared indices for CE-FedAvg (NumPy).

Implements the sparsification step of thesis chapter 3, section 3.2
as fixed by docs/algorithms.md#ce-fedavg: for each weight-delta tensor of rank >= 2 keep
the k = ceil((1 - s) * n) entries with the largest |delta-omega| ("top (s-1)%"
in the thesis means keep the (1 - s) fraction, docs/algorithms.md#errata)
 together with
their flat indices; tensors of lower rank are sent dense. The Adam moment
deltas (delta-m, delta-v) are gathered at the SAME indices as delta-omega:
sparsifying them independently makes clients diverge (thesis section 3.2).

Choices:
  * Non-finite values are replaced by 0 before selection.
  * No error feedback: dropped coordinates are discarded, not accumulated.
  * Ties in |delta-omega| are broken towards the lower flat index; this is what
    `tf.math.top_k` does, so `tf_ops` selects identical indices.
  * The sparsity is read as the nearest fraction with denominator <= 10^6
    before computing k, so that e.g. s = 0.6, n = 100 keeps 40 (not 41 through
    float error in (1 - 0.6) * 100). k >= 1 whenever n >= 1 and s < 1.
  * When k == n (e.g. s = 0) the tensor is sent dense: no indices at all.
"""

import fractions
import math
from typing import Optional, Sequence

import numpy as np

from tff_adaptive.compression import quantizers

DEFAULT_MIN_SPARSIFY_RANK = 2


def num_kept(num_elements: int, sparsity: float) -> int:
  """Number of entries kept, k = ceil((1 - s) * n), for a tensor of n."""
  sparsity = float(sparsity)
  if not 0.0 <= sparsity < 1.0:
    raise ValueError(f'sparsity must be in [0, 1), got {sparsity}.')
  keep = 1 - fractions.Fraction(sparsity).limit_denominator(10**6)
  return min(int(num_elements), math.ceil(keep * int(num_elements)))


def is_sparsified(shape: Sequence[int], sparsity: float,
                  min_rank: int = DEFAULT_MIN_SPARSIFY_RANK) -> bool:
  """Whether a tensor of `shape` is sent sparse (with indices)."""
  n = int(np.prod(shape, dtype=np.int64))
  return len(shape) >= min_rank and num_kept(n, sparsity) < n


def top_k_indices(delta: np.ndarray, k: int) -> np.ndarray:
  """Sorted flat indices of the k largest |delta| (ties: lower index wins)."""
  magnitudes = np.abs(quantizers.sanitize(delta).reshape(-1))
  if not 0 <= k <= magnitudes.size:
    raise ValueError(f'k={k} outside [0, {magnitudes.size}].')
  order = np.argsort(-magnitudes, kind='stable')[:k]
  return np.sort(order).astype(np.int64)


def sparsify(
    delta: np.ndarray,
    sparsity: float,
    min_rank: int = DEFAULT_MIN_SPARSIFY_RANK,
) -> tuple[Optional[np.ndarray], np.ndarray]:
  """Sparsifies one weight-delta tensor.

  Args:
    delta: The tensor (any shape).
    sparsity: Fraction s of entries to drop, in [0, 1).
    min_rank: Tensors of lower rank are kept dense.

  Returns:
    `(indices, values)`: sorted int64 flat indices (None when sent dense) and
    the float32 kept values in index order (all values, flattened, if dense).
  """
  flat = quantizers.sanitize(delta).reshape(-1)
  if not is_sparsified(np.shape(delta), sparsity, min_rank):
    return None, flat
  indices = top_k_indices(flat, num_kept(flat.size, sparsity))
  return indices, flat[indices]


def sparsify_shared(
    delta: np.ndarray,
    states: Sequence[np.ndarray],
    sparsity: float,
    min_rank: int = DEFAULT_MIN_SPARSIFY_RANK,
) -> tuple[Optional[np.ndarray], np.ndarray, list[np.ndarray]]:
  """Sparsifies `delta` and gathers each of `states` at the same indices.

  Args:
    delta: The weight-delta tensor whose magnitudes choose the indices.
    states: Tensors of `delta`'s shape (e.g. delta-m, delta-v).
    sparsity: Fraction s of entries to drop, in [0, 1).
    min_rank: Tensors of lower rank are kept dense.

  Returns:
    `(indices, values, state_values)` as in `sparsify`, with `state_values[j]`
    the float32 entries of `states[j]` at `indices` (or all, if dense).
  """
  shape = np.shape(delta)
  for state in states:
    if np.shape(state) != shape:
      raise ValueError(f'State shape {np.shape(state)} differs from the '
                       f'weight shape {shape}.')
  indices, values = sparsify(delta, sparsity, min_rank)
  flat_states = [quantizers.sanitize(s).reshape(-1) for s in states]
  if indices is not None:
    flat_states = [s[indices] for s in flat_states]
  return indices, values, flat_states


def densify(indices: Optional[np.ndarray], values: np.ndarray,
            shape: Sequence[int]) -> np.ndarray:
  """Scatters `values` at flat `indices` into zeros of `shape` (float32)."""
  values = np.asarray(values, dtype=np.float32)
  if indices is None:
    return values.reshape(shape)
  out = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=np.float32)
  out[indices] = values
  return out.reshape(shape)
