"""Correctness of FedGBO and MFL (docs/algorithms.md#fedgbo and #mfl), and their composition with TFF aggregators.

Every client trajectory is replayed in NumPy (float64) on the linear-softmax
model of `algorithm_testing`, with the optimiser math written from the SPEC
tables (not from `biased_optimizers`), so the checks are independent of the
implementation.
"""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import mfl

K = 3
LR = 0.1
SIZES = (7, 12, 5)  # partial batches; the 5-example client cycles within a round
BETA_1, BETA_2, EPS = 0.8, 0.9, 1e-3
V0 = 0.5  # AdaGrad's initial accumulator (the other rows start from v = 1)
UNIFORM = tff.learning.ClientWeighting.UNIFORM


# TFF's local C++ context for the module, its worker stopped after (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def clients():
  return at.make_clients(SIZES, seed=2)


def _opt(name, beta_1=BETA_1):
  """The client optimiser as a TFF optimiser: the builders read its hyperparameters."""
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(LR, momentum=beta_1)
  if name == 'rmsprop':
    return tff.learning.optimizers.build_rmsprop(LR, decay=beta_1, epsilon=EPS)
  if name == 'adagrad':
    return tff.learning.optimizers.build_adagrad(LR, initial_preconditioner_value=V0,
                                                 epsilon=EPS)
  return tff.learning.optimizers.build_adam(LR, beta_1=beta_1, beta_2=BETA_2, epsilon=EPS)


_PROCESSES = {}


def _cached(key, build):
  if key not in _PROCESSES:
    _PROCESSES[key] = build()
  return _PROCESSES[key]


def _fedgbo(name, upload='model', **kwargs):
  return _cached(('fedgbo', name, upload), lambda: fedgbo.build_fedgbo(
      at.model_fn, _opt(name), local_steps=K, upload=upload,
      **kwargs))


def _mfl_adam(weighting=None):
  return _cached(('mfl', weighting), lambda: mfl.build_mfl(
      at.model_fn, _opt('adam'), local_steps=0,
      client_weighting=weighting))


def _tff_fedavg_uniform():
  return _cached('tff_fedavg_uniform', lambda: tff.learning.algorithms.build_weighted_fed_avg(
      at.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0), client_weighting=UNIFORM))


# ---- The docs/algorithms.md#fedgbo table in NumPy ----


def _np_init(name, x):
  s = collections.OrderedDict()
  if name in ('sgdm', 'adam'):
    s['m'] = [np.zeros_like(a) for a in x]
  if name in ('rmsprop', 'adam'):
    s['v'] = [np.ones_like(a) for a in x]
  if name == 'adagrad':
    s['v'] = [np.full_like(a, V0) for a in x]
  if name == 'adam':
    s['step'] = 0.0
  return s


def _np_fixed_direction(name, s, g):
  """U(g, s) with s fixed."""
  if name == 'sgdm':
    return [BETA_1 * m + (1 - BETA_1) * gi for m, gi in zip(s['m'], g)]
  if name in ('rmsprop', 'adagrad'):
    return [gi / (np.sqrt(v) + EPS) for gi, v in zip(g, s['v'])]
  return [(BETA_1 * m + (1 - BETA_1) * gi) / (np.sqrt(v) + EPS)
          for m, gi, v in zip(s['m'], g, s['v'])]


def _np_track(name, s, g):
  """T(g̃, s)."""
  s = collections.OrderedDict(s)
  if 'm' in s:
    s['m'] = [BETA_1 * m + (1 - BETA_1) * gi for m, gi in zip(s['m'], g)]
  if 'v' in s and name == 'adagrad':  # accumulates
    s['v'] = [v + gi**2 for v, gi in zip(s['v'], g)]
  elif 'v' in s:
    beta = BETA_1 if name == 'rmsprop' else BETA_2  # RMSProp's one β
    s['v'] = [beta * v + (1 - beta) * gi**2 for v, gi in zip(s['v'], g)]
  if 'step' in s:
    s['step'] += 1.0
  return s


def _np_fedgbo_round(name, x, s, clients):
  """One FedGBO round; returns x', s', the mean of all |S|·K gradients, mean first gradient."""
  finals, grads, firsts = [], [], []
  for c in clients:
    w = [a.copy() for a in x]
    for k, (xb, yb) in enumerate(at.np_batches(c, K)):
      g = at.np_grad(w, xb, yb)
      grads.append(g)
      if k == 0:
        firsts.append(g)
      w = [a - LR * d for a, d in zip(w, _np_fixed_direction(name, s, g))]
    finals.append(w)
  ones = lambda v: [1.0] * len(v)
  g_mean = at.weighted_mean(grads, ones(grads))
  return (at.weighted_mean(finals, ones(finals)), _np_track(name, s, g_mean), g_mean,
          at.weighted_mean(firsts, ones(firsts)))


def _stats(state):
  stats = state.finalizer
  out = collections.OrderedDict()
  for key in ('m', 'v'):
    if key in stats:
      out[key] = [np.asarray(t, np.float64) for t in stats[key]]
  if 'step' in stats:
    out['step'] = float(stats['step'])
  return out


def _assert_stats_close(actual, expected, rtol, atol, what):
  assert list(actual) == list(expected), what
  for key in expected:
    if key == 'step':
      assert actual[key] == pytest.approx(expected[key], rel=1e-6), what
    else:
      at.assert_close(actual[key], expected[key], rtol=rtol, atol=atol, what=f'{what} {key}')


# ---------------------------------------------------------------------------
# FedGBO
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('name', biased_optimizers.NAMES)
def test_fedgbo_tracks_mean_of_all_minibatch_gradients(clients, name):
  """docs/algorithms.md#fedgbo: g̃_t (from the inverse step) = mean of the round's |S|·K minibatch gradients."""
  process = _fedgbo(name)
  state = process.initialize()
  x = at.trainable(process, state)
  s = _np_init(name, x)
  _assert_stats_close(_stats(state), s, 0, 0, 'initial state (m = 0, v = 1 or V0)')
  data = at.datasets(clients)
  for r in range(2):  # round 2 starts from m ≠ 0, v ≠ 1
    output = process.next(state, data)
    state = output.state
    x, s_next, g_mean, g_first = _np_fedgbo_round(name, x, s, clients)
    at.assert_close(at.trainable(process, state), x, rtol=1e-5, atol=1e-6, what=f'x round {r}')
    _assert_stats_close(_stats(state), s_next, rtol=1e-4, atol=1e-6, what=f'{name} round {r}')
    # The identity is sharp: tracking only the clients' first gradients (what
    # a one-minibatch estimate would give) does not match.
    wrong = _np_track(name, s, g_first)
    key = 'v' if name in ('rmsprop', 'adagrad') else 'm'
    assert at.max_abs_diff(wrong[key], s_next[key]) > 1e-3
    s = s_next
    assert output.metrics['cost']['client_steps'] == K * len(SIZES)
  assert at.max_abs_diff(g_mean, [np.zeros_like(a) for a in g_mean]) > 1e-2


def test_fedgbo_average_gradient_variant_tracks_the_same_state(clients):
  inverse = _fedgbo('adam')
  variant = _fedgbo('adam', upload='average_gradient')
  data = at.datasets(clients)
  state_a, state_b = inverse.initialize(), variant.initialize()
  for r in range(2):
    state_a = inverse.next(state_a, data).state
    output = variant.next(state_b, data)
    state_b = output.state
    at.assert_close(at.trainable(variant, state_b), at.trainable(inverse, state_a),
                    rtol=1e-5, atol=1e-6, what=f'x round {r}')
    _assert_stats_close(_stats(state_b), _stats(state_a), rtol=1e-4, atol=1e-6,
                        what=f'round {r}')
  num_params = at.D * at.C + at.C
  assert output.metrics['cost']['upload_bits_per_client'] == 32 * 2 * num_params  # Δ and ḡ


def test_fedgbo_sgdm_beta0_equals_fedavg(clients):
  process = _cached('fedgbo_sgdm_beta0', lambda: fedgbo.build_fedgbo(
      at.model_fn, _opt('sgdm', beta_1=0.0), local_steps=K))
  reference = _tff_fedavg_uniform()
  state, ref_state = process.initialize(), reference.initialize()
  at.assert_close(at.trainable(process, state), at.trainable(reference, ref_state), 0, 0)
  for r in range(2):
    state = process.next(state, at.datasets(clients)).state
    ref_state = reference.next(ref_state, at.datasets(clients, steps=K)).state
    at.assert_close(at.trainable(process, state), at.trainable(reference, ref_state),
                    rtol=1e-5, atol=1e-6, what=f'round {r}')
  assert at.max_abs_diff(at.trainable(process, state),
                         at.trainable(process, process.initialize())) > 1e-2


def test_fedgbo_refuses_unequal_local_steps(clients):
  process = _fedgbo('sgdm')
  empty = collections.OrderedDict(x=clients[0]['x'][:0], y=clients[0]['y'][:0])
  with pytest.raises(Exception, match='same number of local steps'):
    process.next(process.initialize(), at.datasets([clients[0], empty]))
  with pytest.raises(ValueError, match='local_steps must be an integer ≥ 1'):
    fedgbo.build_fedgbo(at.model_fn, _opt('sgdm'), local_steps=0)


# ---------------------------------------------------------------------------
# MFL
# ---------------------------------------------------------------------------


def test_mfl_with_plain_sgd_equals_fedavg(clients):
  # There is no 'sgd' biased optimiser: SGDm with β = 0 is plain SGD (m = g).
  process = _cached('mfl_sgd', lambda: mfl.build_mfl(
      at.model_fn, _opt('sgdm', beta_1=0.0), local_steps=K,
      client_weighting=UNIFORM))
  reference = _tff_fedavg_uniform()
  state, ref_state = process.initialize(), reference.initialize()
  x = at.trainable(process, state)
  for r in range(2):
    state = process.next(state, at.datasets(clients)).state
    ref_state = reference.next(ref_state, at.datasets(clients, steps=K)).state
    at.assert_close(at.trainable(process, state), at.trainable(reference, ref_state),
                    rtol=1e-5, atol=1e-6, what=f'round {r}')
    # The averaged state m is the mean of each client's last gradient.
    last = [at.np_sgd_client(x, c, K, LR)[2][-1] for c in clients]
    at.assert_close(_stats(state)['m'], at.weighted_mean(last, [1.0] * len(last)),
                    rtol=1e-4, atol=1e-6)
    x = at.trainable(process, state)


def _np_mfl_adam_round(x, s, clients, uniform):
  """Clients run ordinary Adam (state moving, no bias correction) for one epoch."""
  finals, states, weights = [], [], []
  for c in clients:
    w = [a.copy() for a in x]
    m, v, step = [a.copy() for a in s['m']], [a.copy() for a in s['v']], s['step']
    examples = 0
    for xb, yb in at.np_batches(c, 0):
      g = at.np_grad(w, xb, yb)
      m = [BETA_1 * mi + (1 - BETA_1) * gi for mi, gi in zip(m, g)]
      v = [BETA_2 * vi + (1 - BETA_2) * gi**2 for vi, gi in zip(v, g)]
      step += 1
      w = [wi - LR * mi / (np.sqrt(vi) + EPS) for wi, mi, vi in zip(w, m, v)]
      examples += len(yb)
    finals.append(w)
    states.append((m, v, step))
    weights.append(1.0 if uniform else examples)
  mean = lambda vals: at.weighted_mean(vals, weights)
  new_s = collections.OrderedDict(
      m=mean([st[0] for st in states]), v=mean([st[1] for st in states]),
      step=float(np.average([st[2] for st in states], weights=weights)))
  return mean(finals), new_s


@pytest.mark.parametrize('uniform', [False, True], ids=['example_weighted', 'uniform'])
def test_mfl_adam_state_is_weighted_mean_of_client_states(clients, uniform):
  process = _mfl_adam(UNIFORM if uniform else None)
  state = process.initialize()
  x = at.trainable(process, state)
  s = _np_init('adam', x)
  for r in range(2):
    state = process.next(state, at.datasets(clients)).state
    x, s = _np_mfl_adam_round(x, s, clients, uniform)
    at.assert_close(at.trainable(process, state), x, rtol=1e-5, atol=1e-6, what=f'x round {r}')
    _assert_stats_close(_stats(state), s, rtol=1e-5, atol=1e-7, what=f'round {r}')
  # One epoch: the clients (7, 12, 5 examples, B = 4) ran 2, 3 and 2 steps,
  # so each round adds (7·2 + 12·3 + 5·2)/24 = 2.5 (example-weighted) or 7/3
  # (uniform) to the averaged step counter.
  expected_step = 2 * (7 / 3 if uniform else 2.5)
  assert _stats(state)['step'] == pytest.approx(expected_step, rel=1e-6)


# ---------------------------------------------------------------------------
# Composition with TFF aggregators (noise 0, huge clip = the plain mean).
# ---------------------------------------------------------------------------


def _clipping():
  return tff.aggregators.clipping_factory(clipping_norm=1e6,
                                          inner_agg_factory=tff.aggregators.MeanFactory())


def _dp(num_clients):
  return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=num_clients, clip=1e6)


@pytest.mark.parametrize('algorithm', ['fedgbo', 'mfl'])
@pytest.mark.parametrize('aggregator', ['clipping', 'dp'])
def test_composes_with_tff_aggregators(clients, algorithm, aggregator):
  factory = _clipping() if aggregator == 'clipping' else _dp(len(clients))
  assert isinstance(factory, tff.aggregators.WeightedAggregationFactory if aggregator == 'clipping'
                    else tff.aggregators.UnweightedAggregationFactory)
  if algorithm == 'fedgbo':
    plain = _fedgbo('adam')  # uniform by default
    composed = fedgbo.build_fedgbo(at.model_fn, _opt('adam'), local_steps=K,
                                   model_aggregator=factory)
  else:
    plain = _mfl_adam(UNIFORM)
    # The DP factory is unweighted: that alone must make MFL uniform, state
    # averaging included; the weighted clipping factory is asked for it.
    composed = mfl.build_mfl(at.model_fn, _opt('adam'), local_steps=0, model_aggregator=factory,
                             client_weighting=UNIFORM if aggregator == 'clipping' else None)
  data = at.datasets(clients)
  output = composed.next(composed.initialize(), data)
  state = output.state
  plain_state = plain.next(plain.initialize(), data).state
  at.assert_close(at.trainable(composed, state), at.trainable(plain, plain_state),
                  rtol=1e-5, atol=1e-6, what=f'{algorithm}+{aggregator} x')
  _assert_stats_close(_stats(state), _stats(plain_state), rtol=1e-4, atol=1e-6,
                      what=f'{algorithm}+{aggregator} state')
  assert at.max_abs_diff(at.trainable(composed, state),
                         at.trainable(plain, plain.initialize())) > 1e-2
  # The aggregator's own measurements come through.
  if aggregator == 'clipping':
    assert 'clipped_count' in str(output.metrics['aggregator'])
    assert output.metrics['aggregator']['clipped_count'] == 0


def test_unweighted_aggregator_with_example_weighting_is_refused():
  with pytest.raises(ValueError, match='client_weighting=NUM_EXAMPLES contradicts'):
    mfl.build_mfl(at.model_fn, _opt('adam'), model_aggregator=_dp(3),
                  client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES)
