"""Per-FedAvg and pFedMe as recipes of the round engine, per client and as a cohort.

On the linear-softmax model of `algorithm_testing`, against NumPy replays of
their equations (float64; docs/algorithms.md#mtfl):

  Per-FedAvg (first order): K meta-steps on consecutive batch pairs (D, D'),
    cycling the data (K = 0: one pass in pairs, a last odd batch left out):
      ỹ = y − α ∇f(y; D);   y ← y − β ∇f(ỹ; D');   x ← mean of the y_K;
    UA of x − α ∇f(x; first training batch).
  pFedMe: R steps, each K prox steps θ ← θ − η_p (∇f(θ; D_r) + λ (θ − w)) from
    the previous θ (θ_0 = x), then w ← w − ηλ (w − θ); x ← (1 − β) x + β mean w_R;
    UA of the K prox steps from θ = w = x on the first training batch.

(Before their port they ran on a personalised engine of their own, since
deleted; this test compared both rounds, equal within 1e-7, while it existed.)
"""


import numpy as np
import pytest
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.algorithms import perfedavg
from tff_adaptive.algorithms import pfedme
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data
from tff_adaptive.rounds import stateful

ALPHA, BETA = 0.3, 0.2  # Per-FedAvg
ETA, LAM, ETA_P, INNER, SERVER_BETA = 0.2, 2.0, 0.05, 2, 0.7  # pFedMe
SIZES = (7, 17, 5, 10)  # 2, 5, 2, 3 batches of B = 4: partial batches, an odd count
TEST_SIZES = (6, 3, 5, 9)
SAMPLED = [(0, 1, 2), (2, 1), (3, 0, 1)]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def clients():
  return at.make_clients(SIZES, seed=5), at.make_clients(TEST_SIZES, seed=6)


# ---- NumPy replays (float64) ----


def _np_perfedavg_client(x, client, steps):
  """(y_K, examples): K meta-steps on consecutive batch pairs."""
  batches = at.np_batches(client, 2 * steps)
  pairs = list(zip(batches[0::2], batches[1::2]))
  y = [a.copy() for a in x]
  for (x1, y1), (x2, y2) in pairs:
    y_tilde = [w - ALPHA * g for w, g in zip(y, at.np_grad(y, x1, y1))]
    y = [w - BETA * g for w, g in zip(y, at.np_grad(y_tilde, x2, y2))]
  return y, sum(len(b[1]) for pair in pairs for b in pair), len(pairs)


def _np_prox(theta, w, bx, by):
  for _ in range(INNER):
    g = at.np_grad(theta, bx, by)
    theta = [t - ETA_P * (gi + LAM * (t - wi)) for t, gi, wi in zip(theta, g, w)]
  return theta


def _np_pfedme_client(x, client, steps):
  """(w_R, examples): R steps, θ warm-started across them."""
  w = [a.copy() for a in x]
  theta = [a.copy() for a in w]
  batches = at.np_batches(client, steps)
  for bx, by in batches:
    theta = _np_prox(theta, w, bx, by)
    w = [wi - ETA * LAM * (wi - t) for wi, t in zip(w, theta)]
  return w, sum(len(by) for _, by in batches), len(batches)


def _np_round(algorithm, x, clients, steps):
  finals, weights = [], []
  for client in clients:
    y, examples, _ = _NP_CLIENT[algorithm](x, client, steps)
    finals.append(y)
    weights.append(examples)
  mean = at.weighted_mean(finals, weights)
  rate = SERVER_BETA if algorithm == 'pfedme' else 1.0
  return [(1 - rate) * a + rate * m for a, m in zip(x, mean)]


def _np_personalized(algorithm, x, train):
  first_x, first_y = at.np_batches(train, 0)[0]
  if algorithm == 'pfedme':
    return _np_prox([a.copy() for a in x], x, first_x, first_y)
  return [a - ALPHA * g for a, g in zip(x, at.np_grad(x, first_x, first_y))]


def _np_user_accuracy(algorithm, x, train, test):
  w = _np_personalized(algorithm, x, train)
  logits = test['x'].astype(np.float64) @ w[0] + w[1]
  correct = int(np.sum(np.argmax(logits, -1) == test['y']))
  loss_sum = sum(at.np_loss(w, bx, by) * len(by) for bx, by in at.np_batches(test, 0))
  return correct, loss_sum


_NP_CLIENT = {'perfedavg': _np_perfedavg_client, 'pfedme': _np_pfedme_client}


# ---- the engine's processes ----

_PROCESSES = {}


def _process(algorithm, steps, execution='per_client'):
  key = (algorithm, steps, repr(execution))
  if key not in _PROCESSES:  # built once per module: a build traces the client program
    if algorithm == 'pfedme':
      _PROCESSES[key] = pfedme.build_pfedme(
          at.model_fn, tff.learning.optimizers.build_sgdm(ETA), lam=LAM,
          personal_learning_rate=ETA_P, inner_steps=INNER, beta=SERVER_BETA,
          local_steps=steps, execution=execution)
    else:
      _PROCESSES[key] = perfedavg.build_perfedavg(
          at.model_fn, tff.learning.optimizers.build_sgdm(ALPHA), beta=BETA,
          local_steps=steps, execution=execution)
  return _PROCESSES[key]


def _inputs(process, clients, sampled, shards: bool):
  train, test = clients
  datasets = at.datasets([train[i] for i in sampled])
  tests = at.datasets([test[i] for i in sampled])
  if not shards:
    return [process.client_input(d, test=t) for d, t in zip(datasets, tests)]
  steps = process.batches_per_client(int(process.initialize().client_work['local_steps']))
  made = process.make_shards([cohort_data.client_batches(d, steps) for d in datasets])
  return process.with_test_batches(made, [cohort_data.client_batches(t, 0) for t in tests])


def _ua(output):
  return [(float(c['ua']['correct']), int(c['ua']['examples']), float(c['ua']['loss_sum']))
          for c in output.clients]


def _assert_ua_close(got, want, what):
  for (c1, n1, l1), (c2, n2, l2) in zip(got, want, strict=True):
    assert (c1, n1) == (c2, n2), what
    assert l1 == pytest.approx(l2, rel=1e-5, abs=1e-6), what


@pytest.mark.parametrize('algorithm,steps,mode,shards,in_process', [
    ('perfedavg', 3, 'vectorized', False, True), ('perfedavg', 0, 'sequential', True, False),
    ('pfedme', 3, 'sequential', True, True), ('pfedme', 0, 'vectorized', False, True)])
def test_per_client_cohort_numpy_and_the_old_engine_agree(clients, algorithm, steps, mode,
                                                          shards, in_process):
  """Three rounds: per client = NumPy, cohort = per client (1e-5; one case through
  TFF's executor), their UA and training metrics equal."""
  per_client = _process(algorithm, steps)
  in_cohort = _process(algorithm, steps,
                       cohort.CohortExecution(mode=mode, in_process=in_process))
  assert cohort.is_cohort(in_cohort) and not cohort.is_cohort(per_client)
  assert isinstance(per_client, stateful.PersonalizedClientsProcess)
  assert not per_client.has_private_state
  processes = (per_client, in_cohort)
  states = [p.initialize() for p in processes]
  x = at.trainable(per_client, states[0])
  train, test = clients
  for r, sampled in enumerate(SAMPLED):
    outputs = [per_client.next(states[0], _inputs(per_client, clients, sampled, False)),
               in_cohort.next(states[1], _inputs(in_cohort, clients, sampled, shards))]
    want_ua = [_np_user_accuracy(algorithm, x, train[i], test[i]) for i in sampled]
    x = _np_round(algorithm, x, [train[i] for i in sampled], steps)
    states = [o.state for o in outputs]
    got = [at.trainable(p, s) for p, s in zip(processes, states)]
    at.assert_close(got[0], x, rtol=1e-5, atol=1e-6, what=f'per client vs NumPy, round {r}')
    at.assert_close(got[1], got[0], rtol=1e-5, atol=1e-5, what=f'cohort, round {r}')
    for name, output in zip(('per client', 'cohort'), outputs):
      ua = _ua(output)
      assert [int(c) for c, _, _ in ua] == [c for c, _ in want_ua], (name, r)
      assert [n for _, n, _ in ua] == [TEST_SIZES[i] for i in sampled], (name, r)
      for (_, _, got_loss), (_, want_loss) in zip(ua, want_ua):
        assert got_loss == pytest.approx(want_loss, rel=1e-5), (name, r)
    _assert_ua_close(_ua(outputs[1]), _ua(outputs[0]), f'cohort UA, round {r}')
    # Training metrics count every gradient's forward pass, in both executions.
    train_metrics = [o.metrics['client_work']['train'] for o in outputs]
    for metrics in train_metrics[1:]:
      assert metrics['num_examples'] == train_metrics[0]['num_examples']
      for key in ('loss', 'sparse_categorical_accuracy'):
        assert metrics[key] == pytest.approx(train_metrics[0][key], rel=1e-5), key
    assert outputs[0].metrics['cost']['client_steps'] == sum(
        _NP_CLIENT[algorithm](x, train[i], steps)[2] for i in sampled)
    assert (outputs[1].metrics['client_work']['first_minibatch_loss'] == pytest.approx(
        outputs[0].metrics['client_work']['first_minibatch_loss'], rel=1e-5))
  # The test can fail: three rounds moved the model.
  assert at.max_abs_diff(got[0], at.trainable(per_client, per_client.initialize())) > 1e-2


@pytest.mark.parametrize('algorithm', ['perfedavg', 'pfedme'])
def test_evaluation_without_training_is_the_rounds_ua(clients, algorithm):
  """`evaluate_clients` measures what a round measures before training, in both executions."""
  train, test = clients
  sampled = (1, 3)
  for process in (_process(algorithm, 3),
                  _process(algorithm, 3, cohort.CohortExecution(mode='vectorized'))):
    state = process.initialize()
    data = [process.client_input(d, test=t) for d, t in
            zip(at.datasets([train[i] for i in sampled]), at.datasets([test[i] for i in sampled]))]
    evaluated = [(float(c['ua']['correct']), int(c['ua']['examples']),
                  float(c['ua']['loss_sum'])) for c in process.evaluate_clients(state, data)]
    _assert_ua_close(evaluated, _ua(process.next(state, data)), type(process).__name__)
    want = [_np_user_accuracy(algorithm, at.trainable(process, state), train[i], test[i])
            for i in sampled]
    assert [int(c) for c, _, _ in evaluated] == [c for c, _ in want]


def test_a_cohort_round_without_test_batches_is_refused(clients):
  process = _process('perfedavg', 3, cohort.CohortExecution(mode='vectorized'))
  datasets = at.datasets(clients[0][:2])
  shards = process.make_shards([cohort_data.client_batches(d, 6) for d in datasets])
  with pytest.raises(ValueError, match='with_test_batches'):
    process.next(process.initialize(), shards)
