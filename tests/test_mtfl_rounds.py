"""MTFL on the round engine: rounds against an eager Keras replay, and the cohort.

The replay (`_replay_round`) recomputes a round from its definition
(docs/algorithms.md#mtfl), independently of the engine: each sampled client
patches its stored private batch-norm values (and, with FedAvg-Adam, its
private Adam moments) over the global model, measures UA on its own test data
in inference mode, trains K steps (or one pass) in eager Keras, training mode,
and keeps its new private values; the server takes the example-weighted mean
of the shared values (trainable, moving statistics, FedAvg-Adam's shared
moments and step), stepped by SGD(1) or TFF's Adam (FedAdam) on the shared
trainable weights only. Three rounds with unequal clients, partial batches
and a client coming back to its state of two rounds before.

The cohort (both nestings of feed-forward models: vectorised, in sequence)
gives the per-client rounds within 1e-5 for each private choice and strategy.
"""


import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
import test_mtfl as tm
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import mtfl
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import stateful
from workflow.training import program

LR, ADAM_LR, BETA_1, BETA_2, EPS = 0.1, 0.05, 0.9, 0.99, 1e-8
SAMPLED = [('c0', 'c1'), ('c1', 'c2', 'c3'), ('c0', 'c2')]  # c0 returns in round 3

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


def _client_optimizer(strategy):
  if strategy == 'fedavg_adam':
    return tff.learning.optimizers.build_adam(ADAM_LR, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPS)
  return tff.learning.optimizers.build_sgdm(LR)


def _build(model_fn, keras_model_fn, private, strategy, steps, execution='per_client'):
  return mtfl.build_mtfl(model_fn, keras_model_fn, _client_optimizer(strategy),
                         private=private, strategy=strategy, local_steps=steps,
                         execution=execution)


# ---- the replay ----


class _Replay:
  """The global values and each client's private values, advanced round by round."""

  def __init__(self, process, private, strategy, steps):
    weights = process.get_model_weights(process.initialize())
    self.t = [np.asarray(w) for w in weights.trainable]
    self.n = [np.asarray(w) for w in weights.non_trainable]
    layout = mtfl.patch_layout(tm.bn_keras_model(), private)
    self.pt, self.pn = layout.private_trainable, layout.private_non_trainable
    self.strategy, self.steps = strategy, steps
    self.adam = strategy == 'fedavg_adam'
    shared = [i for i in range(len(self.t)) if i not in self.pt]
    self.shared_t = shared
    self.moments = ([np.zeros_like(self.t[i]) for i in shared],
                    [np.ones_like(self.t[i]) for i in shared], 0.0)
    self.server = None
    if strategy == 'fedadam':
      self.server_opt = fedopt.build_server_optimizer('adam', 0.01)
      self.server = self.server_opt.initialize(
          tuple(tf.TensorSpec(self.t[i].shape, tf.float32) for i in shared))
    self.private = {}  # client → (trainable, non-trainable, m, v) at private positions

  def _patched(self, cid):
    t, n = [a.copy() for a in self.t], [a.copy() for a in self.n]
    own = self.private.get(cid)
    if own is None:  # a new client: the initial model's values, fresh moments
      own = ([self.t[i] for i in self.pt], [self.n[i] for i in self.pn],
             [np.zeros_like(self.t[i]) for i in self.pt],
             [np.ones_like(self.t[i]) for i in self.pt])
    for i, value in zip(self.pt, own[0]):
      t[i] = value
    for i, value in zip(self.pn, own[1]):
      n[i] = value
    m, v = [None] * len(t), [None] * len(t)
    for j, i in enumerate(self.shared_t):
      m[i], v[i] = self.moments[0][j], self.moments[1][j]
    for j, i in enumerate(self.pt):
      m[i], v[i] = own[2][j], own[3][j]
    return t, n, m, v

  def client(self, cid, train, test):
    """(final t, n, m, v, step, examples, UA (correct, loss_sum))."""
    t, n, m, v = self._patched(cid)
    model = tm.bn_keras_model()
    variables = model.trainable_variables + model.non_trainable_variables
    for var, value in zip(variables, t + n):
      var.assign(value)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    logits = model(test['x'], training=False)
    ua = (int(np.sum(np.argmax(logits.numpy(), -1) == test['y'])),
          float(loss_fn(test['y'], logits)) * len(test['y']))
    step, examples = self.moments[2], 0
    for x, y in at.np_batches(train, self.steps):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x.astype(np.float32), training=True))
      grads = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
      examples += len(y)
      if self.adam:
        m = [BETA_1 * a + (1 - BETA_1) * g for a, g in zip(m, grads)]
        v = [BETA_2 * a + (1 - BETA_2) * g * g for a, g in zip(v, grads)]
        step += 1.0
        grads = [a / (np.sqrt(b) + EPS) for a, b in zip(m, v)]
      lr = ADAM_LR if self.adam else LR
      for var, g in zip(model.trainable_variables, grads):
        var.assign(var - lr * g)
    t = [var.numpy() for var in model.trainable_variables]
    n = [var.numpy() for var in model.non_trainable_variables]
    self.private[cid] = ([t[i] for i in self.pt], [n[i] for i in self.pn],
                         [m[i] for i in self.pt], [v[i] for i in self.pt])
    return t, n, m, v, step, examples, ua

  def round(self, ids, train, test):
    results = [self.client(c, train[c], test[c]) for c in ids]
    w = np.array([r[5] for r in results], np.float64)
    w /= w.sum()
    mean = lambda values: sum(wi * np.asarray(x, np.float64) for wi, x in zip(w, values))
    shared_n = [i for i in range(len(self.n)) if i not in self.pn]
    for i in shared_n:
      self.n[i] = mean([r[1][i] for r in results])
    delta = [self.t[i] - mean([r[0][i] for r in results]) for i in self.shared_t]
    if self.server is not None:
      self.server, new = self.server_opt.next(
          self.server, tuple(tf.constant(self.t[i]) for i in self.shared_t),
          tuple(tf.constant(d, tf.float32) for d in delta))
      new = [np.asarray(a) for a in new]
    else:
      new = [self.t[i] - d for i, d in zip(self.shared_t, delta)]
    for i, value in zip(self.shared_t, new):
      self.t[i] = value
    if self.adam:
      self.moments = ([mean([r[2][i] for r in results]) for i in self.shared_t],
                      [mean([r[3][i] for r in results]) for i in self.shared_t],
                      float(mean([r[4] for r in results])))
    return [r[6] for r in results]


def _test_dataset(task, cid):
  return task.baseline.datasets.eval_preprocess_fn(
      task.test_client_data.create_tf_dataset_for_client(cid))


def _assert_state(process, state, replay, what):
  weights = process.get_model_weights(state)
  at.assert_close([np.asarray(a) for a in weights.trainable], replay.t, rtol=1e-5, atol=1e-5,
                  what=f'{what}: trainable')
  at.assert_close([np.asarray(a) for a in weights.non_trainable], replay.n, rtol=1e-5,
                  atol=1e-5, what=f'{what}: non-trainable')


def _assert_private(process, cid, stored, replay, what):
  t, n, m, v = replay.private[cid]
  for values, prefix, positions in ((t, 'trainable', replay.pt), (n, 'non_trainable', replay.pn),
                                    (m, 'optimizer_m', replay.pt), (v, 'optimizer_v', replay.pt)):
    if prefix.startswith('optimizer') and not replay.adam:
      continue
    for i, value in zip(positions, values):
      np.testing.assert_allclose(stored[f'{prefix}_{i}'], value, rtol=1e-5, atol=1e-5,
                                 err_msg=f'{what}: {cid} {prefix}_{i}')


@pytest.mark.parametrize('private,strategy,steps', [
    ('all', 'fedavg_adam', 3), ('mu_sigma', 'fedadam', 0), ('gamma_beta', 'fedavg_adam', 0),
    ('gamma_beta', 'fedadam', 3), ('none', 'fedavg', 3), ('mu_sigma', 'fedavg', 0)])
def test_per_client_rounds_equal_the_replay(private, strategy, steps):
  process = _cached(private, strategy, steps)
  assert isinstance(process, stateful.PersonalizedClientsProcess)
  assert process.has_private_state == (private != 'none')
  task, (train, test) = tm.make_task(), tm._arrays(0)  # pylint: disable=protected-access
  replay = _Replay(process, private, strategy, steps)
  state, stored = process.initialize(), {}
  for r, ids in enumerate(SAMPLED):
    data = [process.client_input(d, stored.get(c, process.private_initial),
                                 test=_test_dataset(task, c))
            for c, d in zip(ids, program.client_datasets(task, list(ids), None))]
    output = process.next(state, data)
    state = output.state
    want_ua = replay.round(ids, train, test)
    _assert_state(process, state, replay, f'{private}/{strategy} round {r}')
    for cid, out, (correct, loss_sum) in zip(ids, output.clients, want_ua):
      assert int(out['ua']['correct']) == correct, (r, cid)
      assert float(out['ua']['loss_sum']) == pytest.approx(loss_sum, rel=1e-5, abs=1e-5)
      if process.has_private_state:
        stored[cid] = out['private']
        _assert_private(process, cid, out['private'], replay, f'round {r}')
      else:
        assert 'private' not in out
  # The replay can fail: three rounds moved the model.
  initial = process.get_model_weights(process.initialize()).trainable
  assert at.max_abs_diff(list(initial), replay.t) > 1e-2


_PROCESSES = {}


def _cached(private, strategy, steps, mode=None):
  """Built once per module (a build traces the client program): the replay's
  per-client processes serve the cohort cases too."""
  key = (private, strategy, steps, mode)
  if key not in _PROCESSES:
    _PROCESSES[key] = _build(tm.bn_model_fn, tm.bn_keras_model, private, strategy, steps,
                             cohort.CohortExecution(mode=mode) if mode else 'per_client')
  return _PROCESSES[key]


def _run_rounds(process, task):
  """Three rounds of `SAMPLED`, each client's stored state fed back: per round the
  (model weights, server statistics) and the clients' outputs."""
  state, stored, rounds = process.initialize(), {}, []
  for ids in SAMPLED:
    data = [process.client_input(d, stored.get(c, process.private_initial),
                                 test=_test_dataset(task, c))
            for c, d in zip(ids, program.client_datasets(task, list(ids), None))]
    output = process.next(state, data)
    state = output.state
    for cid, out in zip(ids, output.clients):
      if process.has_private_state:
        stored[cid] = out['private']
    rounds.append((tf.nest.flatten(process.get_model_weights(state)),
                   tf.nest.flatten(state.finalizer), output.clients))
  return rounds


@pytest.mark.parametrize('private,strategy,steps,mode', [
    ('all', 'fedavg_adam', 3, 'vectorized'), ('mu_sigma', 'fedadam', 0, 'sequential'),
    ('gamma_beta', 'fedavg_adam', 0, 'vectorized'), ('gamma_beta', 'fedadam', 3, 'sequential'),
    ('none', 'fedavg', 3, 'vectorized'), ('mu_sigma', 'fedavg', 0, 'vectorized')])
def test_cohort_equals_per_client(private, strategy, steps, mode):
  """The cohort program (padded batches: batch norm over the real rows, moving
  statistics threaded through the steps) gives the per-client rounds within 1e-5:
  model, server statistics, UA and every client's private values."""
  per_client = _cached(private, strategy, steps)
  in_cohort = _cached(private, strategy, steps, mode)
  assert cohort.is_cohort(in_cohort) and not cohort.is_cohort(per_client)
  task = tm.make_task()
  for r, (want, got) in enumerate(zip(_run_rounds(per_client, task),
                                      _run_rounds(in_cohort, task))):
    at.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5, what=f'model, round {r}')
    at.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5, what=f'server statistics, round {r}')
    for a, b in zip(got[2], want[2], strict=True):
      assert int(a['ua']['correct']) == int(b['ua']['correct'])
      assert float(a['ua']['loss_sum']) == pytest.approx(float(b['ua']['loss_sum']), rel=1e-5)
      assert list(a.get('private', {})) == list(b.get('private', {}))
      for key in a.get('private', {}):
        np.testing.assert_allclose(a['private'][key], b['private'][key], rtol=1e-5, atol=1e-5,
                                   err_msg=f'round {r} {key}')


def test_plain_fl_without_batch_norm_runs_as_a_cohort():
  """FedAvg-Adam with nothing private on a model without non-trainable weights:
  the split Δ (empty non-trainable part) and the shared moments, as a cohort."""
  clients = at.make_clients((7, 17, 5, 10), seed=5)
  tests = at.make_clients((6, 3, 5, 9), seed=6)
  per_client = _build(at.model_fn, at.keras_model, 'none', 'fedavg_adam', 3)
  in_cohort = _build(at.model_fn, at.keras_model, 'none', 'fedavg_adam', 3,
                     cohort.CohortExecution(mode='vectorized'))
  assert cohort.is_cohort(in_cohort) and not per_client.has_private_state
  states = [per_client.initialize(), in_cohort.initialize()]
  for r, sampled in enumerate([(0, 1, 2), (2, 1), (3, 0, 1)]):
    datasets = at.datasets([clients[i] for i in sampled])
    test_sets = at.datasets([tests[i] for i in sampled])
    outputs = [p.next(s, [p.client_input(d, test=t) for d, t in zip(datasets, test_sets)])
               for p, s in zip((per_client, in_cohort), states)]
    states = [o.state for o in outputs]
    at.assert_close(at.trainable(in_cohort, states[1]), at.trainable(per_client, states[0]),
                    rtol=1e-5, atol=1e-5, what=f'round {r}')
    at.assert_close(tf.nest.flatten(states[1].finalizer), tf.nest.flatten(states[0].finalizer),
                    rtol=1e-5, atol=1e-5, what=f'server statistics, round {r}')
    for a, b in zip(outputs[1].clients, outputs[0].clients):
      assert int(a['ua']['correct']) == int(b['ua']['correct'])
  assert at.max_abs_diff(at.trainable(per_client, states[0]),
                         at.trainable(per_client, per_client.initialize())) > 1e-2
