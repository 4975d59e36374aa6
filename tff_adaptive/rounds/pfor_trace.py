"""A cheaper trace of `tf.vectorized_map` for the cohort and population programs.

Before converting an elementwise op (`Add`, `Mul`, `SelectV2`, ...), TF's pfor
reshapes each of its lane-stacked inputs to the op's largest rank
(`_PforInput.expanddim_inputs_for_broadcast`) with about ten graph ops built from
dynamic ranks and shapes (rank, maximum, shape, tile, concat, slice, reshape),
even when every rank is known and nothing needs to move. A client's round is
mostly elementwise ops (optimiser updates, the `tf.where` that keeps a client past
its data unchanged), so building those ops was over half of the vectorised
program's trace (bench/pfor_trace.py: the digits MLP's FedAvg cohort built in
0.45x the time, Mime Lite's in 0.32x; docs/performance.md).

`vectorized_map` (the package's every `tf.vectorized_map`) converts under
`static_broadcast_ranks()`, which replaces that method for the conversion: with
static ranks it inserts the same unit axes with `expand_dims`, and none when the
ranks already agree; with an unknown rank it calls TF's own.
Same tensors, same values: only reshapes that change nothing are left out.
Written against TensorFlow 2.14's private `pfor` module (the TF that TFF 0.87
pins); tests/test_pfor_trace.py checks that the target still exists and that
both forms compute the same.
"""

import contextlib
import importlib
import threading

import tensorflow as tf

TF_VERSION = '2.14'
_PFOR = importlib.import_module('tensorflow.python.ops.parallel_for.pfor')
_TARGET = _PFOR._PforInput  # pylint: disable=protected-access
_TF_OWN = _TARGET.expanddim_inputs_for_broadcast
_LOCK = threading.Lock()
_users = 0


def _with_static_ranks(pfor_input) -> None:
  """`expanddim_inputs_for_broadcast` from static ranks (TF's own for unknown ones)."""
  inputs = pfor_input._inputs  # pylint: disable=protected-access
  ranks = [x.t.shape.rank for x in inputs]
  if not inputs or None in ranks:
    _TF_OWN(pfor_input)
    return
  # As TF's: an input without the lane axis counts one more rank, for the axis it lacks.
  ranks = [r if x.is_stacked else r + 1 for r, x in zip(ranks, inputs)]
  top = max(ranks)
  for i, x in enumerate(inputs):
    if x.is_stacked and ranks[i] < top:
      t = x.t
      for _ in range(top - ranks[i]):
        t = tf.expand_dims(t, 1)  # after the lane axis, as TF's reshape puts its ones
      inputs[i] = _PFOR.wrap(t, True)


@contextlib.contextmanager
def static_broadcast_ranks():
  """Traces of `tf.vectorized_map` inside use `_with_static_ranks` (any thread:
  the replacement stays until the last user leaves)."""
  global _users
  with _LOCK:
    _users += 1
    _TARGET.expanddim_inputs_for_broadcast = _with_static_ranks
  try:
    yield
  finally:
    with _LOCK:
      _users -= 1
      if not _users:
        _TARGET.expanddim_inputs_for_broadcast = _TF_OWN


def vectorized_map(fn, elems):
  """`tf.vectorized_map(fn, elems, fallback_to_while_loop=True)`, converted
  under `static_broadcast_ranks` (pfor converts when this is called: at a trace)."""
  with static_broadcast_ranks():
    return tf.vectorized_map(fn, elems, fallback_to_while_loop=True)
