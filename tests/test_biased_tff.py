"""The FedGBO paper's RMSProp and Adam behind TFF's optimiser API
(tff_adaptive/optimizers/biased_tff.py), against NumPy, and as Mime Lite's base
optimiser (bin/train --mime_statistics=paper)."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.algorithms import mimelite
from tff_adaptive.optimizers import biased_tff
from workflow.training import algorithm_builders
from workflow.training import cli


def _numpy(name, w, grads, lr, b1, b2, eps):
  """Three steps from v = 1, m = 0, no bias correction."""
  m, v = np.zeros_like(w), np.ones_like(w)
  for g in grads:
    if name == 'rmsprop':
      v = b1 * v + (1 - b1) * g * g
      w = w - lr * g / (np.sqrt(v) + eps)
    else:
      m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
      w = w - lr * m / (np.sqrt(v) + eps)
  return w, v


@pytest.mark.parametrize('name', ['rmsprop', 'adam'])
def test_three_steps_equal_numpy_from_v_one_without_bias_correction(name):
  rng = np.random.default_rng(0)
  w0 = rng.normal(size=(3, 2)).astype(np.float32)
  grads = [rng.normal(size=(3, 2)).astype(np.float32) for _ in range(3)]
  opt = (biased_tff.build_paper_rmsprop(0.1, decay=0.8, epsilon=1e-3) if name == 'rmsprop' else
         biased_tff.build_paper_adam(0.1, beta_1=0.8, beta_2=0.95, epsilon=1e-3))
  state = opt.initialize([tf.TensorSpec(w0.shape, tf.float32)])
  np.testing.assert_array_equal(state['v'][0], np.ones_like(w0))
  weights = [tf.constant(w0)]
  for g in grads:
    state, weights = opt.next(state, weights, [tf.constant(g)])
  want_w, want_v = _numpy(name, w0, grads, 0.1, 0.8, 0.95, 1e-3)
  np.testing.assert_allclose(weights[0], want_w, rtol=1e-5)
  np.testing.assert_allclose(state['v'][0], want_v, rtol=1e-5)
  assert float(opt.get_hparams(state)[tff.learning.optimizers.LEARNING_RATE_KEY]) == pytest.approx(0.1)


@pytest.mark.usefixtures('local_cpp_context')
def test_mime_lite_keeps_the_papers_statistics_and_the_flag_picks_them():
  settings, _ = cli.config_from_args(['--algorithm=mimelite', '--client_optimizer=rmsprop',
                                      '--client_learning_rate=0.01', '--mime_statistics=paper'])
  base = algorithm_builders.mime_base_optimizer(settings)
  assert isinstance(base, biased_tff.BiasedTFFOptimizer) and base.table.name == 'rmsprop'
  tff_default, _ = cli.config_from_args(['--algorithm=mimelite', '--client_optimizer=rmsprop'])
  assert not isinstance(algorithm_builders.mime_base_optimizer(tff_default),
                        biased_tff.BiasedTFFOptimizer)
  process = mimelite.build_mimelite(at.model_fn, base, local_steps=2)
  state = process.initialize()
  v0 = tf.nest.flatten(state.finalizer['base']['v'])
  assert all(np.all(np.asarray(v) == 1.0) for v in v0)
  state = process.next(state, at.datasets(at.make_clients((5, 7), seed=1))).state
  v1 = tf.nest.flatten(state.finalizer['base']['v'])
  assert any(np.any(np.asarray(v) != 1.0) for v in v1)  # the server statistics moved
