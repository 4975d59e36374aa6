"""Tests of the SM3 client optimisers: a set-based NumPy model and SM3's invariants."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at  # pylint: disable=g-bad-import-order

from tff_adaptive.execution import runtime
from tff_adaptive.optimizers import paper_fedopt
from tff_adaptive.optimizers import sm3

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

_LR, _EPS = 0.5, 1e-12


def _specs(dtype=tf.float64, shapes=((4, 3), (2, 3, 4), (5,), ())):
  return collections.OrderedDict(
      (f'w{i}', tf.TensorSpec(s, dtype)) for i, s in enumerate(shapes))


def _student_t(rng, specs, df=1.5, scale=1.0):
  """Heavy-tailed gradients (infinite variance for df ≤ 2)."""
  return tf.nest.map_structure(
      lambda s: tf.constant(scale * rng.standard_t(df, s.shape), s.dtype),
      specs)


def _zeros(specs):
  return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)


def _flat(structure):
  return [np.asarray(x) for x in tf.nest.flatten(structure)]


def _moves(opt, specs, grads):
  """Per-step updates −Δx, feeding x = 0 each step so they come back exactly."""
  state = opt.initialize(specs)
  moves, states = [], [state]
  for g in grads:
    state, w = opt.next(state, _zeros(specs), g)
    moves.append([-x for x in _flat(w)])
    states.append(state)
  return moves, states


def _implied_nu(move, numerator, lr=_LR, eps=_EPS):
  """Solves |move| = lr |numerator| / (√ν + ε) for ν."""
  return (lr * np.abs(numerator) / np.abs(move) - eps)**2


# A set-based model of SM3, written from the paper's definition: explicit
# cover sets S_b as masks, μ_b one float per set, ν_j a min over sets ∋ j.


def _cover_masks(shape):
  if len(shape) <= 1:
    n = int(np.prod(shape))
    return [np.arange(n).reshape(shape) == i for i in range(n)]
  index = np.indices(shape)
  return [index[a] == i for a in range(len(shape)) for i in range(shape[a])]


def _numpy_sm3(form, grads, lr, eps, delay=1, b1=0.9, b2=0.999, bc=False):
  """Trajectory of one tensor (from x = 0) under SM3 with delayed statistics."""
  masks = _cover_masks(grads[0].shape)
  mu = np.zeros(len(masks))
  m = np.zeros(grads[0].shape)
  x = np.zeros(grads[0].shape)

  def cover_max(v):
    return np.array([v[mask].max() for mask in masks])

  def cover_min(mu):
    return np.min([np.where(mask, mu_b, np.inf)
                   for mask, mu_b in zip(masks, mu)], axis=0)

  refreshes, trajectory = 0, []
  for t, g in enumerate(grads, start=1):
    refresh = (t - 1) % delay == 0
    refreshes += refresh
    num = g
    if form == 'I':
      if refresh:
        mu = mu + cover_max(g**2)
      nu = cover_min(mu)
    elif form == 'II':
      nu = cover_min(mu) + (g**2 if refresh else 0.0)
      if refresh:
        mu = cover_max(nu)
    else:
      if refresh:
        mu = b2 * mu + (1 - b2) * cover_max(g**2)
      nu = cover_min(mu)
      m = b1 * m + (1 - b1) * g
      num = m
      if bc:
        num, nu = m / (1 - b1**t), nu / (1 - b2**refreshes)
    x = x - lr * num / (np.sqrt(nu) + eps)
    trajectory.append(x.copy())
  return trajectory


def _run(opt, specs, grads):
  state, w = opt.initialize(specs), _zeros(specs)
  trajectory = []
  for g in grads:
    state, w = opt.next(state, w, g)
    trajectory.append(_flat(w))
  return state, trajectory


@pytest.mark.parametrize('delay', [1, 2])
@pytest.mark.parametrize('form, bc', [('I', False), ('II', False),
                                      ('adam', False), ('adam', True)])
def test_matches_set_based_numpy_model(form, bc, delay):
  rng = np.random.default_rng(0)
  specs = _specs()
  grads = [_student_t(rng, specs) for _ in range(5)]
  if form == 'adam':
    opt = sm3.build_sm3_adam(0.1, beta_1=0.8, beta_2=0.9, epsilon=1e-3,
                             bias_correction=bc, delay=delay)
  else:
    opt = sm3.build_sm3_adagrad(0.1, variant=form, epsilon=1e-3, delay=delay)
  _, got = _run(opt, specs, grads)
  flat_grads = [_flat(g) for g in grads]
  for leaf in range(len(tf.nest.flatten(specs))):
    want = _numpy_sm3(form, [g[leaf] for g in flat_grads], 0.1, 1e-3, delay,
                      b1=0.8, b2=0.9, bc=bc)
    for got_t, want_t in zip(got, want):
      np.testing.assert_allclose(got_t[leaf], want_t, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('variant', ['I', 'II'])
def test_nu_bounds_sum_of_squared_gradients(variant):
  rng = np.random.default_rng(1)
  specs = _specs()
  grads = [_student_t(rng, specs) for _ in range(6)]
  moves, _ = _moves(sm3.build_sm3_adagrad(_LR, variant, _EPS), specs, grads)
  sum_sq = [np.zeros(x.shape) for x in _flat(grads[0])]
  for g, move in zip(grads, moves):
    for leaf, (g_j, move_j) in enumerate(zip(_flat(g), move)):
      sum_sq[leaf] = sum_sq[leaf] + g_j**2
      assert np.all(_implied_nu(move_j, g_j) >= sum_sq[leaf] * (1 - 1e-9))


def test_sm3_ii_is_tighter_than_sm3_i():
  rng = np.random.default_rng(2)
  specs = _specs()
  grads = [_student_t(rng, specs) for _ in range(6)]
  moves_1, _ = _moves(sm3.build_sm3_adagrad(_LR, 'I', _EPS), specs, grads)
  moves_2, _ = _moves(sm3.build_sm3_adagrad(_LR, 'II', _EPS), specs, grads)
  strictly_tighter = 0
  for g, m1, m2 in zip(grads, moves_1, moves_2):
    for g_j, a, b in zip(_flat(g), m1, m2):
      nu_1, nu_2 = _implied_nu(a, g_j), _implied_nu(b, g_j)
      assert np.all(nu_2 <= nu_1 * (1 + 1e-9))
      strictly_tighter += np.sum(nu_2 < nu_1 * (1 - 1e-6))
  # On rank ≥ 2 tensors the two variants really differ.
  assert strictly_tighter > 10


@pytest.mark.parametrize('variant', ['I', 'II'])
def test_singleton_covers_reproduce_diagonal_adagrad(variant):
  rng = np.random.default_rng(3)
  specs = _specs(shapes=((7,), ()))
  grads = [_student_t(rng, specs) for _ in range(6)]
  state, got = _run(sm3.build_sm3_adagrad(0.1, variant, 1e-4), specs, grads)
  _, adagrad = _run(paper_fedopt.build_paper_client_adagrad(0.1, 1e-4), specs,
                    grads)
  x = [np.zeros(s.shape) for s in tf.nest.flatten(specs)]
  v = [np.zeros(s.shape) for s in tf.nest.flatten(specs)]
  for g, got_t, adagrad_t in zip(grads, got, adagrad):
    for leaf, g_j in enumerate(_flat(g)):
      v[leaf] = v[leaf] + g_j**2
      x[leaf] = x[leaf] - 0.1 * g_j / (np.sqrt(v[leaf]) + 1e-4)
      np.testing.assert_allclose(got_t[leaf], x[leaf], rtol=1e-13, atol=0)
      np.testing.assert_array_equal(got_t[leaf], adagrad_t[leaf])
  for (mu,), v_leaf in zip(state['sm3_statistics'], v):
    np.testing.assert_allclose(mu, v_leaf, rtol=1e-13)


@pytest.mark.parametrize('variant', ['I', 'II'])
def test_undelayed_step_is_at_most_learning_rate(variant):
  rng = np.random.default_rng(4)
  specs = _specs(tf.float32)
  grads = [_student_t(rng, specs, df=1.1) for _ in range(8)]
  moves, _ = _moves(sm3.build_sm3_adagrad(0.01, variant, 1e-8), specs, grads)
  largest = max(np.max(np.abs(x)) for step in moves for x in step)
  assert largest <= 0.01 * (1 + 1e-6)
  assert largest > 0.005  # The bound is nearly attained, not vacuous.


def test_delayed_step_can_exceed_learning_rate():
  # FedAda2 paper App. F: a stale ν does not bound the move of a larger gradient.
  specs = _specs(tf.float32, shapes=((3, 2),))
  small = _zeros(specs)
  small = tf.nest.map_structure(lambda z: z + 0.01, small)
  large = tf.nest.map_structure(lambda z: z * 1000.0, small)
  moves, _ = _moves(sm3.build_sm3_adagrad(0.01, 'II', 1e-8, delay=2), specs,
                    [small, large])
  np.testing.assert_allclose(moves[1][0], 0.01 * 1000.0, rtol=1e-5)


@pytest.mark.parametrize('form', ['I', 'II', 'adam'])
def test_delayed_statistics_change_only_on_refresh_steps(form):
  rng = np.random.default_rng(5)
  specs = _specs()
  grads = [_student_t(rng, specs) for _ in range(8)]
  delay = 3
  if form == 'adam':
    opt = sm3.build_sm3_adam(_LR, epsilon=_EPS, delay=delay)
  else:
    opt = sm3.build_sm3_adagrad(_LR, form, _EPS, delay=delay)
  moves, states = _moves(opt, specs, grads)
  changed_at = []
  for t in range(1, len(states)):
    before = tf.nest.flatten(states[t - 1]['sm3_statistics'])
    after = tf.nest.flatten(states[t]['sm3_statistics'])
    if any(np.any(np.asarray(a) != np.asarray(b))
           for a, b in zip(after, before)):
      changed_at.append(t)
  assert changed_at == [1, 4, 7]
  if form == 'II':
    return  # Its stale ν is a cover bound, checked by the NumPy model test.
  # Between refreshes the preconditioner is exactly the last refresh's ν.
  for t in range(1, len(states)):
    numerator = (_flat(states[t]['accumulator']) if form == 'adam'
                 else _flat(grads[t - 1]))
    nu = [_implied_nu(mv, num) for mv, num in zip(moves[t - 1], numerator)]
    if t in (1, 4, 7):
      fresh = nu
    else:
      for a, b in zip(nu, fresh):
        np.testing.assert_allclose(a, b, rtol=1e-8)


def test_statistics_memory_is_sum_of_dimensions():
  assert sm3.cover_shapes((6, 4)) == [(6,), (4,)]
  assert sm3.cover_shapes((2, 3, 4)) == [(2,), (3,), (4,)]
  assert sm3.cover_shapes((5,)) == [(5,)]
  assert sm3.cover_shapes(()) == [()]
  specs = _specs(tf.float32, shapes=((6, 4), (2, 3, 4), (5,), ()))
  n = 24 + 24 + 5 + 1
  covers = (6 + 4) + (2 + 3 + 4) + 5 + 1
  for name, opt, want in [
      ('sm3_adagrad', sm3.build_sm3_adagrad(0.1), covers),
      ('sm3_adam', sm3.build_sm3_adam(0.1), n + covers),
      ('adam', paper_fedopt.build_paper_client_adam(0.1), 2 * n),
      ('adagrad', paper_fedopt.build_paper_client_adagrad(0.1), n),
  ]:
    state = opt.initialize(specs)
    hparams = set(opt.get_hparams(state)) | {'step'}
    in_state = sum(np.size(x) for k, v in state.items() if k not in hparams
                   for x in tf.nest.flatten(v))
    assert in_state == want, name
    assert sm3.client_state_floats(name, specs) == want, name
  row_col = sm3.build_sm3_adagrad(0.1).initialize(
      _specs(tf.float32, shapes=((6, 4),)))['sm3_statistics']
  assert [tuple(x.shape) for x in row_col[0]] == [(6,), (4,)]


def test_stackoverflow_logistic_regression_memory():
  layer = tf.keras.layers.Dense(500)
  layer.build((None, 10000))
  specs = [tf.TensorSpec(v.shape, v.dtype) for v in layer.trainable_variables]
  assert sm3.sm3_statistics_floats(specs) == 11_000
  assert sm3.client_state_floats('sm3_adagrad', specs) == 11_000
  assert sm3.client_state_floats('sm3_adam', specs) == 5_000_500 + 11_000
  assert sm3.client_state_floats('adam', specs) == 2 * 5_000_500
  state = sm3.build_sm3_adagrad(0.1).initialize(specs)
  assert sum(np.size(x) for x in tf.nest.flatten(state['sm3_statistics'])
            ) == 11_000
  with pytest.raises(ValueError, match='optimizer_name'):
    sm3.client_state_floats('lamb', specs)


@pytest.mark.parametrize('builder, kwargs, name', [
    (sm3.build_sm3_adagrad, dict(delay=0), 'delay'),
    (sm3.build_sm3_adam, dict(delay=1.5), 'delay'),
    (sm3.build_sm3_adagrad, dict(epsilon=0.0), 'epsilon'),
    (sm3.build_sm3_adam, dict(epsilon=-1e-3), 'epsilon'),
    (sm3.build_sm3_adam, dict(beta_1=1.0), 'beta_1'),
    (sm3.build_sm3_adam, dict(beta_2=-0.1), 'beta_2'),
    (sm3.build_sm3_adam, dict(beta_2=1.0), 'beta_2'),
    (sm3.build_sm3_adagrad, dict(variant='III'), 'variant'),
    (sm3.build_sm3_adagrad, dict(learning_rate=-0.1), 'learning_rate'),
])
def test_invalid_hparams_name_the_parameter(builder, kwargs, name):
  kwargs.setdefault('learning_rate', 0.1)
  with pytest.raises(ValueError, match=name):
    builder(**kwargs)


def test_hparams_round_trip():
  specs = _specs(tf.float32)
  opt = sm3.build_sm3_adam(0.1)
  state = opt.initialize(specs)
  assert list(opt.get_hparams(state)) == ['learning_rate', 'epsilon', 'beta_1',
                                          'beta_2']
  frozen = opt.set_hparams(state, collections.OrderedDict(learning_rate=0.0))
  _, w = opt.next(frozen, _zeros(specs),
                  _student_t(np.random.default_rng(6), specs))
  assert not any(x.any() for x in _flat(w))
  with pytest.raises(KeyError):
    opt.set_hparams(state, {'momentum': 0.1})


def test_runs_inside_tff_tf_computation():
  runtime.use_local_cpp_context()
  specs = _specs(tf.float32)
  opt = sm3.build_sm3_adam(0.1, epsilon=1e-3, bias_correction=True, delay=2)
  initialize, next_fn = at.optimizer_computations(opt, specs)

  rng = np.random.default_rng(7)
  grads = [_student_t(rng, specs) for _ in range(3)]
  state, w = initialize(), _zeros(specs)
  for g in grads:
    state, w = next_fn(state, w, g)
  _, eager = _run(opt, specs, grads)
  assert int(state['step']) == 3
  for a, b in zip(_flat(w), eager[-1]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_state_survives_a_tf_data_reduce_loop():
  # TFF's client loop threads the optimiser state through `Dataset.reduce`,
  # which would stack a Python list of differently shaped accumulators.
  rng = np.random.default_rng(8)
  specs = _specs(tf.float32)
  grads = [_student_t(rng, specs) for _ in range(4)]
  opt = sm3.build_sm3_adam(0.1, epsilon=1e-3, delay=3)
  dataset = tf.data.Dataset.from_tensor_slices(
      tf.nest.map_structure(lambda *g: tf.stack(g), *grads))

  @tf.function
  def loop():
    state = opt.initialize(specs)
    state['step'] = tf.constant(0)
    return dataset.reduce((state, _zeros(specs)),
                          lambda acc, g: opt.next(acc[0], acc[1], g))

  _, w = loop()
  _, eager = _run(opt, specs, grads)
  for a, b in zip(_flat(w), eager[-1]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fedavg_with_sm3_clients_and_paper_fedadam_server():
  runtime.use_local_cpp_context()
  tf.keras.utils.set_random_seed(9)

  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.Input((6,)),
        tf.keras.layers.Dense(8, activation='relu'),
        tf.keras.layers.Dense(3),
    ])
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(tf.TensorSpec([None, 6], tf.float32),
                    tf.TensorSpec([None], tf.int32)))

  rng = np.random.default_rng(9)
  data = [
      tf.data.Dataset.from_tensor_slices(
          (rng.normal(size=(10, 6)).astype(np.float32),
           rng.integers(0, 3, 10).astype(np.int32))).batch(5)
      for _ in range(2)
  ]
  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=sm3.build_sm3_adam(0.01, delay=2,
                                             bias_correction=True),
      server_optimizer_fn=paper_fedopt.build_paper_adam(0.1))
  state = process.initialize()
  before = _flat(process.get_model_weights(state).trainable)
  for _ in range(2):
    output = process.next(state, data)
    state = output.state
  after = _flat(process.get_model_weights(state).trainable)
  assert np.isfinite(output.metrics['client_work']['train']['loss'])
  assert int(state.finalizer['step']) == 2
  for a, b in zip(after, before):
    assert np.all(np.isfinite(a)) and np.any(a != b)
