"""FedAda2 family (the FedAda2 paper, docs/algorithms.md#fedada2): DJA vs no-PC, one round against NumPy, costs, DP.

The SM3 and paper-Adam optimisers themselves are unit-tested in test_sm3.py
and test_paper_fedopt.py; here they run inside the `fedada2` learning
process. Every process trains the linear-softmax models of
`algorithm_testing` (5 → 3, and a 60 → 10 one shaped like `synthetic`), so
each client trajectory and the server step can be replayed in NumPy
(float64) from the docs/algorithms.md#fedada2 formulas, written here independently of the
implementation.
"""

import collections
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
import train_config  # pylint: disable=g-bad-import-order
from workflow import errors
from workflow.flags import config
from workflow.flags import validation
from workflow.training import cli
from tff_adaptive.accounting import privacy
from tff_adaptive.aggregators import dp
from tff_adaptive.algorithms import fedada2
from tff_adaptive.optimizers import sm3

K = 3
SIZES = (7, 12, 5)  # partial batches; the 5-example client cycles within a round
CLIENT_LR, SERVER_LR = 0.05, 0.1
C_BETA_1, C_BETA_2, C_EPS = 0.9, 0.99, 1e-4
S_BETA_1, S_BETA_2, TAU = 0.9, 0.99, 1e-3
UNIFORM = tff.learning.ClientWeighting.UNIFORM


# TFF's local C++ context for the module, its worker stopped after (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def clients():
  return at.make_clients(SIZES, seed=4)


_PROCESSES = {}


def _process(client, preconditioner, server='adam', warmup=False):
  key = (client, preconditioner, server, warmup)
  if key not in _PROCESSES:
    _PROCESSES[key] = fedada2.build_fedada2(
        at.model_fn,
        fedada2.build_client_optimizer(
            client, CLIENT_LR, beta_1=C_BETA_1, beta_2=C_BETA_2, epsilon=C_EPS),
        fedada2.build_server_optimizer(
            server, SERVER_LR, beta_1=S_BETA_1, beta_2=S_BETA_2, tau=TAU),
        local_steps=K, preconditioner=preconditioner, warmup=warmup)
  return _PROCESSES[key]


# ---- docs/algorithms.md#fedada2 in NumPy ----


def _np_client(x0, client, *, optimizer, lr, steps=K, v0=None, warmup=False,
               batch_size=at.B):
  """K local steps of the client optimiser from (x0, m = 0, v = v0 or 0); returns (y_K, n)."""
  w = [a.copy() for a in x0]
  m = [np.zeros_like(a) for a in x0]
  v = ([np.zeros_like(a) for a in x0] if v0 is None else
       [np.array(b, np.float64) for b in v0])
  # SM3 covers: a row and a column accumulator for the kernel, a diagonal for the bias.
  mu = [[np.zeros(a.shape[0]), np.zeros(a.shape[1])] if a.ndim == 2 else [np.zeros(a.shape)]
        for a in x0]
  examples = 0
  for k, (xb, yb) in enumerate(at.np_batches(client, steps, batch_size)):
    g = at.np_grad(w, xb, yb)
    lr_k = lr * min(1.0, (k + 1) / 10) if warmup else lr
    new_w = []
    for i, (wi, gi) in enumerate(zip(w, g)):
      if optimizer == 'adagrad':  # paper client AdaGrad: v += g², no momentum
        v[i] = v[i] + gi**2
        new_w.append(wi - lr_k * gi / (np.sqrt(v[i]) + C_EPS))
        continue
      m[i] = C_BETA_1 * m[i] + (1 - C_BETA_1) * gi
      if optimizer == 'adam':
        v[i] = C_BETA_2 * v[i] + (1 - C_BETA_2) * gi**2
        nu = v[i]
      else:  # sm3_adam: μ_b ← β2 μ_b + (1 − β2) max_{j∈S_b} g_j², ν_j = min_{b∋j} μ_b
        g2 = gi**2
        if gi.ndim == 2:
          mu[i][0] = C_BETA_2 * mu[i][0] + (1 - C_BETA_2) * g2.max(axis=1)
          mu[i][1] = C_BETA_2 * mu[i][1] + (1 - C_BETA_2) * g2.max(axis=0)
          nu = np.minimum(mu[i][0][:, None], mu[i][1][None, :])
        else:
          mu[i][0] = C_BETA_2 * mu[i][0] + (1 - C_BETA_2) * g2
          nu = mu[i][0]
      new_w.append(wi - lr_k * m[i] / (np.sqrt(nu) + C_EPS))
    w = new_w
    examples += len(yb)
  return w, examples


def _np_server(x, s, mean_delta, server):
  """FedOpt Algorithm 2 (paper semantics); the FedAda2 paper's AdaGrad: v = Σ Δ̄² from 0."""
  m = [S_BETA_1 * a + (1 - S_BETA_1) * d for a, d in zip(s['m'], mean_delta)]
  if server == 'adam':
    v = [S_BETA_2 * a + (1 - S_BETA_2) * d**2 for a, d in zip(s['v'], mean_delta)]
  else:
    v = [a + d**2 for a, d in zip(s['v'], mean_delta)]
  x = [w - SERVER_LR * a / (np.sqrt(b) + TAU) for w, a, b in zip(x, m, v)]
  return x, {'m': m, 'v': v}


def _np_round(x, s, clients, *, optimizer, preconditioner, server, warmup=False,
              client_lr=CLIENT_LR):
  v0 = s['v'] if preconditioner == 'dja' else None
  deltas, weights = [], []
  for c in clients:
    y, n = _np_client(x, c, optimizer=optimizer, lr=client_lr, v0=v0, warmup=warmup)
    deltas.append([a - b for a, b in zip(x, y)])
    weights.append(n)
  return _np_server(x, s, at.weighted_mean(deltas, weights), server)


def _np_server_init(x, server):
  v0 = TAU**2 if server == 'adam' else 0.0
  return {'m': [np.zeros_like(a) for a in x], 'v': [np.full_like(a, v0) for a in x]}


# ---- dja vs none ----


def test_dja_clients_start_from_the_servers_v_and_none_from_zeros():
  """The client optimiser state a round starts from, inspected on the 5 → 3 model."""
  specs = [tf.TensorSpec(s, tf.float32) for s in ((at.D, at.C), (at.C,))]
  server = fedada2.build_server_optimizer('adam', SERVER_LR)
  server_state = collections.OrderedDict(server.initialize(specs))
  rng = np.random.default_rng(0)
  server_v = tuple(tf.constant(rng.uniform(0.1, 2.0, s.shape), tf.float32) for s in specs)
  server_state['preconditioner'] = server_v
  y0 = [tf.constant(rng.normal(size=s.shape), tf.float32) for s in specs]
  for client in ('adam', 'adagrad'):
    opt = fedada2.build_client_optimizer(client, CLIENT_LR)
    dja = fedada2.fedada2_recipe(opt, server, preconditioner='dja')
    local = dja.init_local(dja.broadcast(server_state), y0)
    for got, want in zip(local['preconditioner'], server_v):
      np.testing.assert_array_equal(got.numpy(), want.numpy())
    if 'accumulator' in local:  # Adam's m_0 = 0 in both modes
      assert all(not np.any(a.numpy()) for a in local['accumulator'])
    none = fedada2.fedada2_recipe(opt, server, preconditioner='none')
    assert none.broadcast(server_state) == ()
    local = none.init_local(none.broadcast(server_state), y0)
    assert all(not np.any(a.numpy()) for a in local['preconditioner'])
  # SM3 clients always start from zero statistics (FedAda2).
  sm3_opt = fedada2.build_client_optimizer('sm3_adam', CLIENT_LR)
  none = fedada2.fedada2_recipe(sm3_opt, server, preconditioner='none')
  local = none.init_local((), y0)
  assert all(not np.any(mu.numpy()) for stats in local['sm3_statistics'] for mu in stats)


@pytest.mark.parametrize('preconditioner', ['dja', 'none'])
def test_process_clients_start_from_injected_server_v(clients, preconditioner):
  """Set the server's v to a random positive tensor: only DJA clients see it."""
  process = _process('adam', preconditioner)
  state = process.initialize()
  x = at.trainable(process, state)
  rng = np.random.default_rng(1)
  v = [rng.uniform(1e-4, 1e-2, a.shape) for a in x]
  stats = collections.OrderedDict(state.finalizer)
  stats['preconditioner'] = [a.astype(np.float32) for a in v]
  state = state._replace(finalizer=stats)
  out = process.next(state, at.datasets(clients))
  got = at.trainable(process, out.state)
  s = {'m': [np.zeros_like(a) for a in x], 'v': v}
  want_dja, _ = _np_round(x, s, clients, optimizer='adam', preconditioner='dja', server='adam')
  want_none, _ = _np_round(x, s, clients, optimizer='adam', preconditioner='none',
                           server='adam')
  want, other = (want_dja, want_none) if preconditioner == 'dja' else (want_none, want_dja)
  at.assert_close(got, want, rtol=2e-4, atol=2e-6, what=preconditioner)
  assert at.max_abs_diff(want, other) > 100 * at.max_abs_diff(got, want)


# ---- one round (and a second) against NumPy ----


@pytest.mark.parametrize('client, preconditioner, server, warmup', [
    ('sm3_adam', 'none', 'adam', False),  # FedAda2 itself
    ('adam', 'none', 'adam', False),  # no-PC (Adam–Adam)
    ('adam', 'dja', 'adam', True),  # DJA (Adam–Adam), client lr warm-up
    ('adagrad', 'dja', 'adagrad', False),  # DJA with the FedAda2 paper's server AdaGrad + momentum
])
def test_rounds_match_numpy(clients, client, preconditioner, server, warmup):
  process = _process(client, preconditioner, server, warmup)
  state = process.initialize()
  x = at.trainable(process, state)
  s = _np_server_init(x, server)
  for round_num in range(2):
    state = process.next(state, at.datasets(clients)).state
    x, s = _np_round(x, s, clients, optimizer=client, preconditioner=preconditioner,
                     server=server, warmup=warmup)
    at.assert_close(at.trainable(process, state), x, rtol=2e-4, atol=2e-6,
                    what=f'round {round_num + 1}')
    at.assert_close(at.flat(state.finalizer['preconditioner']), s['v'], rtol=1e-3, atol=1e-9,
                    what='server v')
  assert int(state.finalizer['step']) == 2


# ---- costs ----


def test_download_upload_and_client_memory_from_metrics(clients):
  n = at.D * at.C + at.C  # |x| = 18
  covers = at.D + at.C + at.C  # kernel rows + columns, bias diagonal
  hparams_bits = 32 + 32  # the round's client lr (float32) and K (int32)
  costs = {}
  for client, pc in (('adam', 'dja'), ('adam', 'none'), ('sm3_adam', 'none'),
                     ('adagrad', 'dja')):
    server = 'adagrad' if client == 'adagrad' else 'adam'
    process = _process(client, pc, server, warmup=client == 'adam' and pc == 'dja')
    costs[client, pc] = process.next(process.initialize(), at.datasets(clients)).metrics['cost']
  # DJA: x and the server's v (2|x|); no-PC / FedAda2: x only. Up: Δ only.
  assert costs['adam', 'dja']['download_bits_per_client'] == 32 * 2 * n + hparams_bits
  assert costs['adagrad', 'dja']['download_bits_per_client'] == 32 * 2 * n + hparams_bits
  assert costs['adam', 'none']['download_bits_per_client'] == 32 * n + hparams_bits
  assert costs['sm3_adam', 'none']['download_bits_per_client'] == 32 * n + hparams_bits
  for c in costs.values():
    assert c['upload_bits_per_client'] == 32 * n
    assert c['download_bits'] == c['download_bits_per_client'] * len(SIZES)
  # Client optimiser state: Adam 2|x| (DJA's v replaces the zero one), SM3-Adam |x| + Σ covers,
  # AdaGrad |x|.
  assert costs['adam', 'dja']['client_optimizer_state_floats'] == 2 * n
  assert costs['adam', 'none']['client_optimizer_state_floats'] == 2 * n
  assert costs['sm3_adam', 'none']['client_optimizer_state_floats'] == n + covers
  assert costs['adagrad', 'dja']['client_optimizer_state_floats'] == n
  specs = [tf.TensorSpec((at.D, at.C)), tf.TensorSpec((at.C,))]
  assert sm3.client_state_floats('sm3_adam', specs) == n + covers


# ---- DP ----

D60, C10 = 60, 10


def _model_60_10():
  keras = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(D60,)),
      tf.keras.layers.Dense(C10, kernel_initializer=tf.keras.initializers.RandomNormal(
          stddev=0.1, seed=3))])
  spec = collections.OrderedDict(x=tf.TensorSpec([None, D60], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  return tff.learning.models.from_keras_model(
      keras, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=spec)


def _clients_60_10(sizes, seed):
  rng = np.random.default_rng(seed)
  out = []
  for i, n in enumerate(sizes):
    x = rng.normal(loc=0.5 * i, size=(n, D60)).astype(np.float32)
    out.append(collections.OrderedDict(x=x, y=rng.integers(0, C10, n).astype(np.int32)))
  return out


def _dp_process(client_lr, noise, clip, clients_per_round):
  """FedAda2 (SM3-Adam clients) with TFF's DP aggregator and a server SGD(1) step, so that
  x_{t+1} = x_t − (DP aggregate) is observable."""
  return fedada2.build_fedada2(
      _model_60_10,
      fedada2.build_client_optimizer('sm3_adam', client_lr, beta_2=C_BETA_2, epsilon=C_EPS),
      tff.learning.optimizers.build_sgdm(1.0), local_steps=K, preconditioner='none',
      model_aggregator=dp.dp_aggregator(noise, clip, clients_per_round))


def test_dp_aggregate_is_the_mean_of_clipped_updates_within_the_clip_norm():
  clip, lr = 0.05, 0.5
  data = _clients_60_10((9, 6, 8), seed=5)
  process = _dp_process(lr, noise=0.0, clip=clip, clients_per_round=len(data))
  state = process.initialize()
  x = at.trainable(process, state)
  state = process.next(state, at.datasets(data)).state
  aggregate = [a - b for a, b in zip(x, at.trainable(process, state))]
  deltas = []
  for c in data:
    y, _ = _np_client(x, c, optimizer='sm3_adam', lr=lr)
    deltas.append([a - b for a, b in zip(x, y)])
  norms = [np.sqrt(sum(np.sum(d**2) for d in delta)) for delta in deltas]
  assert min(norms) > 4 * clip  # every client is clipped: the bound is not vacuous
  # Uniform weighting of the clipped updates (client sizes differ).
  want = [sum(d[j] * min(1.0, clip / nrm) for d, nrm in zip(deltas, norms)) / len(data)
          for j in range(2)]
  at.assert_close(aggregate, want, rtol=1e-4, atol=1e-7)
  assert np.sqrt(sum(np.sum(a**2) for a in aggregate)) <= clip * (1 + 1e-5)


def test_dp_noise_std_is_sigma_clip_over_clients():
  """Zero updates (client lr 0): the aggregate is pure noise N(0, (σC/n)²) per coordinate."""
  sigma, clip, n, rounds = 1.5, 0.2, 3, 4
  data = _clients_60_10((5, 5, 5), seed=6)
  process = _dp_process(0.0, noise=sigma, clip=clip, clients_per_round=n)
  state = process.initialize()
  samples = []
  for _ in range(rounds):
    x = at.trainable(process, state)
    state = process.next(state, at.datasets(data)).state
    samples.append(np.concatenate([(a - b).ravel() for a, b in
                                   zip(x, at.trainable(process, state))]))
  samples = np.stack(samples)  # rounds × 610
  expected = sigma * clip / n
  m = samples.size  # 2,440: the std estimate has relative error ≈ 1/√(2m) ≈ 1.4%
  assert np.std(samples) == pytest.approx(expected, rel=5 / np.sqrt(2 * m))
  assert abs(np.mean(samples)) < 5 * expected / np.sqrt(m)
  # Fresh noise every round, and Gaussian tails (kurtosis 3).
  assert np.corrcoef(samples[0], samples[1])[0, 1] < 0.15
  z = (samples - samples.mean()) / samples.std()
  assert np.mean(z**4) == pytest.approx(3.0, abs=0.4)


def test_epsilon_is_monotone_in_rounds_and_noise():
  q, delta = 10 / 1000, 1e-5
  eps_rounds = [privacy.epsilon(1.0, q, t, delta) for t in (1, 10, 100, 1000)]
  assert all(a < b for a, b in zip(eps_rounds, eps_rounds[1:]))
  eps_noise = [privacy.epsilon(s, q, 100, delta) for s in (0.5, 0.8, 1.0, 2.0, 5.0)]
  assert all(a > b for a, b in zip(eps_noise, eps_noise[1:]))
  assert privacy.epsilon(1.0, q, 0, delta) == 0.0
  assert privacy.epsilon(0.0, q, 10, delta) == float('inf')
  # Full participation, one round: the Gaussian mechanism's ε is finite and sensible.
  assert 1.0 < privacy.epsilon(2.0, 1.0, 1, delta) < 5.0


def test_bin_train_reports_epsilon_per_round():
  """`dp/epsilon` as bin/train adds it to each round's metrics (δ = 1 / population)."""
  task = types.SimpleNamespace(train_data=types.SimpleNamespace(client_ids=list(range(40))))
  settings = config.from_flags(dict(dp=True, dp_noise_multiplier=1.2, dp_clip_norm=0.1,
                                    dp_delta=0.0, clients_per_round=4))
  metrics_fn = cli._dp_metrics_fn(settings, task)  # pylint: disable=protected-access
  rows = [metrics_fn(t, None) for t in range(1, 6)]
  assert all(r['dp/delta'] == 1 / 40 for r in rows)
  eps = [r['dp/epsilon'] for r in rows]
  assert all(0 < a < b for a, b in zip(eps, eps[1:]))
  assert eps[-1] == privacy.epsilon(1.2, 0.1, 5, 1 / 40)


# ---- bad input ----

BAD = [
    (['--algorithm=fedada2', '--client_optimizer=sm3_adam', '--dp', '--dp_noise_multiplier=1'],
     '--dp_clip_norm'),
    (['--algorithm=fedada2', '--client_optimizer=sm3_adam', '--dp', '--dp_clip_norm=0.1'],
     '--dp_noise_multiplier'),
    (['--algorithm=fedada2', '--client_optimizer=sm3_adam', '--sm3_delay=0'], '--sm3_delay'),
    (['--algorithm=fedada2', '--client_optimizer=adam', '--preconditioner=diag'],
     '--preconditioner'),
]


def _config(args):
  cfg = dict(task='digits', algorithm='fedavg', client_optimizer='sgd', clients_per_round=10,
             client_learning_rate=0.1, server_learning_rate=1.0, local_steps=0, sm3_delay=1,
             dp=False, dp_clip_norm=None, dp_noise_multiplier=None)
  for arg in args:
    name, _, value = arg[2:].partition('=')
    cfg[name] = True if not value else value if not value[0].isdigit() else float(value)
  cfg['sm3_delay'] = int(cfg['sm3_delay'])
  return cfg


@pytest.mark.parametrize('args, flag', BAD[:3])  # BAD[3] fails in the flag parser
def test_validate_names_the_flag(args, flag):
  with pytest.raises(errors.UsageError, match=flag):
    validation.validate(config.from_flags(_config(args)))


def test_builders_name_the_argument():
  with pytest.raises(ValueError, match='fedada2: preconditioner must be one of'):
    fedada2.fedada2_recipe(fedada2.build_client_optimizer('adam', 0.1),
                           fedada2.build_server_optimizer('adam', 0.1), preconditioner='diag')
  with pytest.raises(ValueError, match="fedada2: preconditioner='dja' needs a dense"):
    fedada2.fedada2_recipe(fedada2.build_client_optimizer('sm3_adam', 0.1),
                           fedada2.build_server_optimizer('adam', 0.1), preconditioner='dja')
  with pytest.raises(ValueError, match='build_client_optimizer: delay must be ≥ 1'):
    fedada2.build_client_optimizer('sm3_adagrad', 0.1, delay=0)
  with pytest.raises(ValueError, match='dp_aggregator: clip_norm must be > 0'):
    dp.dp_aggregator(1.0, None, 10)
  with pytest.raises(ValueError, match='dp_aggregator: noise_multiplier must be ≥ 0'):
    dp.dp_aggregator(None, 0.1, 10)


def test_bin_train_bad_input_exits_2_with_one_line(tmp_path):
  """Through the real binary: a flag-parser error and a validation error, in parallel."""
  cases = [BAD[0], BAD[3]]
  for (args, flag), (result, out) in zip(
      cases, train_config.refused_runs(tmp_path, [args for args, _ in cases])):
    train_config.assert_refused(result, out, flag, args)
