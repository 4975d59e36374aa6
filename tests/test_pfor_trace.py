"""rounds/pfor_trace.py: the vectorised traces' static-rank broadcast computes what
TF's own does, builds fewer ops, and is TF's own again once the last user leaves."""

import numpy as np
import pytest
import tensorflow as tf

from tff_adaptive.rounds import pfor_trace


def test_the_replaced_method_is_in_the_installed_tf():
  assert tf.__version__.startswith(pfor_trace.TF_VERSION)
  assert callable(pfor_trace._TF_OWN)  # pylint: disable=protected-access
  assert pfor_trace._TARGET.expanddim_inputs_for_broadcast is pfor_trace._TF_OWN


def _lanes(x, table, flags):
  """Elementwise ops of every broadcast kind: lane rank below, at and above the others'."""
  scaled = x * table  # lane [3] against [4, 3]: TF moves the lane's axis
  shifted = x + 1.0  # lane [3] against a scalar
  picked = tf.where(flags, scaled, -scaled)  # SelectV2: [3] flags against [4, 3]
  return picked + shifted, tf.maximum(x, 0.5)


def _traced(x_spec, vectorized_map):
  table = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
  fn = tf.function(lambda x, flags: vectorized_map(
      lambda a: _lanes(a[0], table, a[1]), (x, flags)), autograph=False)
  return fn.get_concrete_function(x_spec, tf.TensorSpec([None, 3], tf.bool))


@pytest.mark.parametrize('x_spec', [tf.TensorSpec([None, 3], tf.float32),
                                    tf.TensorSpec(None, tf.float32)],
                         ids=['static_ranks', 'unknown_rank'])
def test_same_values_as_tfs_own_and_fewer_ops_when_ranks_are_known(x_spec):
  x = tf.constant(np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32))
  flags = tf.constant(np.random.default_rng(1).random((5, 3)) > 0.5)
  own = _traced(x_spec, tf.vectorized_map)
  static = _traced(x_spec, pfor_trace.vectorized_map)  # the package's every vectorized_map
  for want, got in zip(own(x, flags), static(x, flags)):
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  ops = lambda f: len(f.graph.get_operations())
  assert ops(static) < ops(own)  # unknown rank: fewer only where the others' are known


def test_tfs_own_again_after_the_last_user_even_on_an_error():
  with pfor_trace.static_broadcast_ranks():
    with pfor_trace.static_broadcast_ranks():
      pass
    assert pfor_trace._TARGET.expanddim_inputs_for_broadcast is not pfor_trace._TF_OWN
  with pytest.raises(RuntimeError):
    with pfor_trace.static_broadcast_ranks():
      raise RuntimeError('trace failed')
  assert pfor_trace._TARGET.expanddim_inputs_for_broadcast is pfor_trace._TF_OWN
