"""Tests of the FedOpt Algorithm 2 optimisers against an independent NumPy model."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import algorithm_testing as at  # pylint: disable=g-bad-import-order

from tff_adaptive.execution import runtime
from tff_adaptive.optimizers import paper_fedopt

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

def _specs(dtype=tf.float64):
  """A nested structure with rank 0 to 3 leaves."""
  return collections.OrderedDict(
      dense=[tf.TensorSpec((4, 3), dtype), tf.TensorSpec((3,), dtype)],
      scale=tf.TensorSpec((), dtype),
      conv=tf.TensorSpec((2, 2, 3), dtype))


def _random_like(rng, specs, scale=1.0):
  return tf.nest.map_structure(
      lambda s: tf.constant(scale * rng.normal(size=s.shape), s.dtype), specs)


def _numpy(structure):
  return [np.asarray(x) for x in tf.nest.flatten(structure)]


def _numpy_algorithm2(kind, x0, grads, lr, b1, b2, tau, v0, bias_correction=False):
  """Algorithm 2 of Reddi et al. written directly, one leaf at a time."""
  xs, ms, vs = list(x0), [np.zeros_like(x) for x in x0], [
      np.full_like(x, v0) for x in x0]
  trajectory = []
  for t, g_list in enumerate(grads, start=1):
    for i, g in enumerate(g_list):
      ms[i] = b1 * ms[i] + (1 - b1) * g
      vs[i] = at.np_second_moment(kind, vs[i], g, b2)
      m_hat, v_hat = ms[i], vs[i]
      if bias_correction:
        m_hat, v_hat = m_hat / (1 - b1**t), v_hat / (1 - b2**t)
      xs[i] = xs[i] - lr * m_hat / (np.sqrt(v_hat) + tau)
    trajectory.append([x.copy() for x in xs])
  return trajectory


def _run(opt, specs, x0, grads):
  state = opt.initialize(specs)
  w = x0
  trajectory = []
  for g in grads:
    state, w = opt.next(state, w, g)
    trajectory.append(_numpy(w))
  return state, trajectory


_BUILDERS = {
    'adagrad': paper_fedopt.build_paper_adagrad,
    'adam': paper_fedopt.build_paper_adam,
    'yogi': paper_fedopt.build_paper_yogi,
}


@pytest.mark.parametrize('kind', ['adagrad', 'adam', 'yogi'])
@pytest.mark.parametrize('v0', [None, 0.3])
def test_server_matches_numpy_algorithm2(kind, v0):
  rng = np.random.default_rng(0)
  specs = _specs()
  x0 = _random_like(rng, specs)
  # Changing magnitudes make Yogi's sign(v - g²) take both signs.
  grads = [_random_like(rng, specs, scale) for scale in (1.0, 0.05, 3.0, 0.01, 1.0)]
  lr, b1, b2, tau = 0.3, 0.8, 0.95, 0.02
  # One signature for all three (Adagrad ignores beta_2), as callers rely on.
  opt = _BUILDERS[kind](lr, beta_1=b1, beta_2=b2, tau=tau,
                        initial_accumulator_value=v0)
  _, got = _run(opt, specs, x0, grads)
  want = _numpy_algorithm2(kind, _numpy(x0), [_numpy(g) for g in grads], lr,
                           b1, b2, tau, tau**2 if v0 is None else v0)
  for got_t, want_t in zip(got, want):
    for a, b in zip(got_t, want_t):
      np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_yogi_preconditioner_moves_both_ways():
  # Guards the Yogi reference test against a gradient sequence that never
  # exercises the decreasing branch (where Yogi and Adagrad-like growth differ).
  rng = np.random.default_rng(0)
  specs = _specs()
  opt = paper_fedopt.build_paper_yogi(0.3, beta_2=0.95, tau=0.02)
  state = opt.initialize(specs)
  w = _random_like(rng, specs)
  signs = set()
  for scale in (1.0, 0.05, 3.0, 0.01, 1.0):
    v_old = _numpy(state['preconditioner'])
    state, w = opt.next(state, w, _random_like(rng, specs, scale))
    for a, b in zip(_numpy(state['preconditioner']), v_old):
      signs.update(np.unique(np.sign(a - b)).tolist())
  assert {-1.0, 1.0} <= signs


def _quadratic_pseudo_gradient(a, b, x, client_lr):
  # One local SGD step on f(x) = ½ a x² − b x gives Δ = x − y = η_c ∇f(x).
  return tf.nest.map_structure(lambda a_, b_, x_: client_lr * (a_ * x_ - b_),
                               a, b, x)


def _fedopt_on_quadratic(opt, specs, a, b, x0, client_lr, rounds=8):
  state = opt.initialize(specs)
  x = x0
  trajectory = []
  for _ in range(rounds):
    state, x = opt.next(state, x,
                        _quadratic_pseudo_gradient(a, b, x, client_lr))
    trajectory.append(np.concatenate([v.ravel() for v in _numpy(x)]))
  return np.stack(trajectory)


@pytest.mark.parametrize('kind', ['adagrad', 'adam', 'yogi'])
@pytest.mark.parametrize('v0', [None, 0.5])
def test_scale_invariance(kind, v0):
  """η_c → cη_c, τ → cτ, v_{−1} → c²v_{−1} leaves the iterates unchanged."""
  rng = np.random.default_rng(1)
  specs = _specs()
  a = tf.nest.map_structure(
      lambda s: tf.constant(rng.uniform(0.5, 2.0, s.shape), s.dtype), specs)
  b = _random_like(rng, specs)
  x0 = _random_like(rng, specs)
  client_lr, tau, c = 0.05, 1e-2, 10.0

  def build(tau_scale):
    v = None if v0 is None else v0 * tau_scale**2
    return _BUILDERS[kind](0.1, tau=tau * tau_scale,
                           initial_accumulator_value=v)

  base = _fedopt_on_quadratic(build(1), specs, a, b, x0, client_lr)
  scaled = _fedopt_on_quadratic(build(c), specs, a, b, x0, c * client_lr)
  np.testing.assert_allclose(scaled, base, rtol=1e-9, atol=1e-12)
  # The property is not vacuous: scaling η_c alone does change the iterates.
  unscaled_tau = _fedopt_on_quadratic(build(1), specs, a, b, x0,
                                      c * client_lr)
  assert np.max(np.abs(unscaled_tau - base)) > 1e-3


@pytest.mark.parametrize('bias_correction', [False, True])
def test_client_adam_matches_numpy(bias_correction):
  rng = np.random.default_rng(2)
  specs = _specs()
  x0 = _random_like(rng, specs)
  grads = [_random_like(rng, specs) for _ in range(4)]
  opt = paper_fedopt.build_paper_client_adam(
      0.01, beta_1=0.9, beta_2=0.99, epsilon=1e-6,
      bias_correction=bias_correction)
  state = opt.initialize(specs)
  for leaf in _numpy(state['accumulator']) + _numpy(state['preconditioner']):
    assert not leaf.any()
  _, got = _run(opt, specs, x0, grads)
  want = _numpy_algorithm2('adam', _numpy(x0), [_numpy(g) for g in grads],
                           0.01, 0.9, 0.99, 1e-6, 0.0, bias_correction)
  for a, b in zip(got[-1], want[-1]):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_client_adagrad_matches_numpy():
  rng = np.random.default_rng(3)
  specs = _specs()
  x0 = _random_like(rng, specs)
  grads = [_random_like(rng, specs) for _ in range(4)]
  _, got = _run(paper_fedopt.build_paper_client_adagrad(0.1, epsilon=1e-6),
                specs, x0, grads)
  # Plain AdaGrad: v = Σ g², x ← x − η g/(√v + ε) with ε outside the √.
  x, v = _numpy(x0), [0.0] * len(_numpy(x0))
  for g in grads:
    g = _numpy(g)
    v = [vi + gi**2 for vi, gi in zip(v, g)]
    x = [xi - 0.1 * gi / (np.sqrt(vi) + 1e-6) for xi, gi, vi in zip(x, g, v)]
  for a, b in zip(got[-1], x):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_hparams_round_trip_and_control_the_step():
  rng = np.random.default_rng(4)
  specs = _specs()
  opt = paper_fedopt.build_paper_adam(0.5, tau=0.1)
  state = opt.initialize(specs)
  hparams = opt.get_hparams(state)
  assert list(hparams) == ['learning_rate', 'beta_1', 'beta_2', 'epsilon']
  assert hparams['epsilon'] == pytest.approx(0.1)
  frozen = opt.set_hparams(state, collections.OrderedDict(learning_rate=0.0))
  w = _random_like(rng, specs)
  _, w_new = opt.next(frozen, w, _random_like(rng, specs))
  for a, b in zip(_numpy(w_new), _numpy(w)):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(KeyError):
    opt.set_hparams(state, {'momentum': 0.1})
  adagrad = paper_fedopt.build_paper_adagrad(0.1)
  assert list(adagrad.get_hparams(adagrad.initialize(specs))) == [
      'learning_rate', 'beta_1', 'epsilon']


@pytest.mark.parametrize('builder, kwargs, name', [
    (paper_fedopt.build_paper_adam, dict(beta_1=1.0), 'beta_1'),
    (paper_fedopt.build_paper_yogi, dict(beta_2=-0.1), 'beta_2'),
    (paper_fedopt.build_paper_adagrad, dict(tau=0.0), 'epsilon'),
    (paper_fedopt.build_paper_adam, dict(initial_accumulator_value=-1.0),
     'initial_accumulator_value'),
    (paper_fedopt.build_paper_client_adam, dict(learning_rate=-1.0),
     'learning_rate'),
])
def test_invalid_hparams(builder, kwargs, name):
  kwargs.setdefault('learning_rate', 0.1)
  with pytest.raises(ValueError, match=name):
    builder(**kwargs)


def test_runs_inside_tff_tf_computation():
  runtime.use_local_cpp_context()
  specs = _specs(tf.float32)
  opt = paper_fedopt.build_paper_yogi(0.1, tau=0.01)
  initialize, next_fn = at.optimizer_computations(opt, specs)

  rng = np.random.default_rng(5)
  x0 = _random_like(rng, specs)
  grads = [_random_like(rng, specs) for _ in range(3)]
  state, w = initialize(), x0
  for g in grads:
    state, w = next_fn(state, w, g)
  _, eager = _run(opt, specs, x0, grads)
  assert int(state['step']) == 3
  for a, b in zip(_numpy(w), eager[-1]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
