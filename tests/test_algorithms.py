"""Correctness of the FedOpt family (both semantics), Mimelite/MimeXlite and FLOPs.

The algorithms' correctness tests; FedGBO and MFL are in test_fedgbo.py,
the process-level bits and FLOPs in test_algorithm_costs.py. Every process runs
on the tiny linear-softmax model of `algorithm_testing` (5 → 3) with a few
unshuffled clients, and is compared against TFF's own builders or against an
independent NumPy implementation.
"""

import inspect
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
from tasks.models import paper_cnns
from workflow.flags import algorithms as workflow_algorithms
from tff_adaptive.accounting import flops
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import fedprox
from tff_adaptive.algorithms import mimelite
from tff_adaptive.algorithms import mimexlite
from tff_adaptive.algorithms import names
from tff_adaptive.algorithms import server_optimizers
from tff_adaptive.rounds import layout

K = 3
CLIENT_LR = 0.1
# Sizes 7, 12, 5 with B = 4: partial batches, and with K = 3 the 5-example
# client cycles through its data within a round.
SIZES = (7, 12, 5)
ROUNDS = 3  # FedOpt vs TFF
PAPER_ROUNDS = 2


# TFF's local C++ context for the module, its worker stopped after (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def clients():
  return at.make_clients(SIZES, seed=1)


def _run_rounds(process, state, data, rounds=ROUNDS):
  trajectory = []
  for _ in range(rounds):
    output = process.next(state, data)
    state = output.state
    trajectory.append(at.trainable(process, state))
  return state, trajectory, output.metrics


# ---------------------------------------------------------------------------
# FedOpt, `tff` semantics: identical to TFF's build_weighted_fed_avg.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('algorithm, server_lr, built_k', [
    ('fedavg', 1.0, K),  # built in K-step mode; epochs mode set through hparams
    ('fedadam', 0.05, 0),  # built in epochs mode; K-step mode set through hparams
])
def test_fedopt_tff_semantics_equals_tff_fed_avg(clients, algorithm, server_lr, built_k):
  name = fedopt.ALGORITHM_SERVER_OPTIMIZER[algorithm]
  ours = fedopt.build_fedopt(
      at.model_fn, tff.learning.optimizers.build_sgdm(CLIENT_LR),
      fedopt.build_server_optimizer(name, server_lr), local_steps=built_k)
  reference = tff.learning.algorithms.build_weighted_fed_avg(
      at.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(CLIENT_LR),
      server_optimizer_fn=fedopt.build_server_optimizer(name, server_lr))
  initial = ours.initialize()
  assert int(initial.client_work['local_steps']) == built_k
  ref_initial = reference.initialize()
  at.assert_close(at.trainable(ours, initial), at.trainable(reference, ref_initial), 0, 0)

  for mode_k in (K, 0):
    state = layout.set_round_hparams(initial, local_steps=mode_k)
    # TFF's builder trains on whatever it is given: for K steps, the same K
    # batches our composer cycles through (unshuffled data, so identical).
    _, ours_traj, ours_metrics = _run_rounds(ours, state, at.datasets(clients))
    _, ref_traj, ref_metrics = _run_rounds(
        reference, ref_initial, at.datasets(clients, steps=mode_k))
    for r, (a, b) in enumerate(zip(ours_traj, ref_traj)):
      at.assert_close(a, b, rtol=1e-5, atol=1e-6, what=f'{algorithm} K={mode_k} round {r + 1}')
    # The weights really moved, and K-step mode saw K batches per client.
    assert at.max_abs_diff(ours_traj[-1], at.trainable(ours, initial)) > 1e-2
    expected_batches = K * len(SIZES) if mode_k else sum(math.ceil(n / at.B) for n in SIZES)
    assert ours_metrics['cost']['client_steps'] == expected_batches
    assert ref_metrics['client_work']['train']['num_batches'] == expected_batches
    np.testing.assert_allclose(ours_metrics['client_work']['train']['loss'],
                               ref_metrics['client_work']['train']['loss'], rtol=1e-5)


# ---------------------------------------------------------------------------
# FedOpt, `paper` semantics: Algorithm 2 in NumPy, end to end.
# ---------------------------------------------------------------------------

PAPER = dict(beta_1=0.9, beta_2=0.99, tau=0.01)
PAPER_SERVER_LR = 0.05


def _np_fedopt_paper(kind, x0, clients, rounds, lr, server_lr, beta_1, beta_2, tau, v0,
                     steps=K):
  """Reddi et al. Algorithm 2, written in the paper's convention Δ = y − x."""
  x = [a.copy() for a in x0]
  m = [np.zeros_like(a) for a in x]
  v = [np.full_like(a, v0) for a in x]
  trajectory = []
  for _ in range(rounds):
    results = [at.np_sgd_client(x, c, steps, lr) for c in clients]
    deltas = [[y - xi for y, xi in zip(w, x)] for w, _, _ in results]
    delta = at.weighted_mean(deltas, [n for _, n, _ in results])  # example-weighted
    for j, d in enumerate(delta):
      m[j] = beta_1 * m[j] + (1 - beta_1) * d
      v[j] = at.np_second_moment(kind, v[j], d, beta_2)
      x[j] = x[j] + server_lr * m[j] / (np.sqrt(v[j]) + tau)
    trajectory.append([a.copy() for a in x])
  return trajectory


_PAPER_PROCESSES = {}


def _paper_process(kind):
  if kind not in _PAPER_PROCESSES:
    _PAPER_PROCESSES[kind] = fedopt.build_fedopt(
        at.model_fn, tff.learning.optimizers.build_sgdm(CLIENT_LR),
        fedopt.build_server_optimizer(kind, PAPER_SERVER_LR, semantics='paper', **PAPER),
        local_steps=K)
  return _PAPER_PROCESSES[kind]


@pytest.mark.parametrize('kind', ['adagrad', 'adam', 'yogi'])
def test_fedopt_paper_semantics_matches_numpy_algorithm2(clients, kind):
  process = _paper_process(kind)
  state = process.initialize()
  x0 = at.trainable(process, state)
  _, trajectory, _ = _run_rounds(process, state, at.datasets(clients), rounds=PAPER_ROUNDS)
  expected = _np_fedopt_paper(kind, x0, clients, PAPER_ROUNDS, CLIENT_LR, PAPER_SERVER_LR,
                              v0=PAPER['tau']**2, **PAPER)
  for r, (a, b) in enumerate(zip(trajectory, expected)):
    at.assert_close(a, b, rtol=2e-5, atol=2e-6, what=f'{kind} round {r + 1}')
  # The tolerance discriminates: Algorithm 2 with v_{−1} = 0 instead of the
  # default τ² already lands measurably elsewhere after one round.
  other = _np_fedopt_paper(kind, x0, clients, 1, CLIENT_LR, PAPER_SERVER_LR, v0=0.0, **PAPER)
  assert at.max_abs_diff(other[0], expected[0]) > 1e-4


@pytest.mark.parametrize('kind', ['adagrad', 'adam', 'yogi'])
def test_fedopt_paper_semantics_scale_invariance(clients, kind):
  """docs/algorithms.md#fedopt: with K = 1, (η, τ, v_{−1}) → (cη, cτ, c²v_{−1}) leaves the iterates unchanged."""
  c, v0 = 10.0, 4e-4
  process = _paper_process(kind)
  specs = [tf.TensorSpec(w.shape, tf.float32) for w in at.trainable(process, process.initialize())]

  def state_for(client_lr, tau, initial_accumulator):
    # The server optimiser's initial state, as its builder makes it, placed
    # into the process state; η is the round hyperparameter.
    server_opt = fedopt.build_server_optimizer(
        kind, PAPER_SERVER_LR, semantics='paper', beta_1=PAPER['beta_1'],
        beta_2=PAPER['beta_2'], tau=tau, initial_accumulator=initial_accumulator)
    state = process.initialize()
    state = state._replace(finalizer=tf.nest.map_structure(
        lambda old, new: np.asarray(new, np.asarray(old).dtype), state.finalizer,
        server_opt.initialize(specs)))
    return layout.set_round_hparams(state, client_learning_rate=client_lr, local_steps=1)

  data = at.datasets(clients)
  _, base, _ = _run_rounds(process, state_for(CLIENT_LR, PAPER['tau'], v0), data,
                           rounds=PAPER_ROUNDS)
  _, scaled, _ = _run_rounds(process, state_for(c * CLIENT_LR, c * PAPER['tau'], c * c * v0),
                             data, rounds=PAPER_ROUNDS)
  for r, (a, b) in enumerate(zip(base, scaled)):
    at.assert_close(a, b, rtol=1e-4, atol=1e-6, what=f'{kind} round {r + 1}')
  # Control: scaling η alone (τ, v_{−1} kept) changes the iterates.
  _, eta_only, _ = _run_rounds(process, state_for(c * CLIENT_LR, PAPER['tau'], v0), data,
                               rounds=1)
  assert at.max_abs_diff(eta_only[0], base[0]) > 1e-3
  assert at.max_abs_diff(base[-1], at.trainable(process, process.initialize())) > 1e-3


def test_every_server_optimiser_entry_is_named_built_and_registered():
  """docs/algorithms.md#adding-a-server-optimiser: what one entry of the table brings."""
  parameters = inspect.signature(fedopt.build_server_optimizer).parameters
  for name, entry in server_optimizers.SERVER_OPTIMIZERS.items():
    assert names.FEDOPT_ALGORITHM_SERVER_OPTIMIZER[entry.algorithm] == name
    assert getattr(fedopt, f'build_{entry.algorithm}').__name__ == f'build_{entry.algorithm}'
    assert workflow_algorithms.ALGORITHMS[entry.algorithm].build == 'build_fedopt'
    for builder in filter(None, (entry.tff, entry.paper)):
      assert set(builder.keywords.values()) <= set(parameters) - {'name', 'learning_rate'}
    for semantics in ('tff', 'paper'):
      assert isinstance(fedopt.build_server_optimizer(name, 0.1, semantics=semantics),
                        tff.learning.optimizers.Optimizer)


def test_an_added_entry_is_built_with_its_keywords(monkeypatch):
  """The docs' example entry (TFF's AdamW, one form: the semantics do not apply)."""
  entry = server_optimizers.ServerOptimizer(
      'fedadamw', server_optimizers.Builder('tensorflow_federated:learning.optimizers.build_adamw',
                                            {'beta_1': 'beta_1', 'epsilon': 'tau'}),
      adaptive=True)
  monkeypatch.setitem(server_optimizers.SERVER_OPTIMIZERS, 'adamw', entry)
  for semantics in ('tff', 'paper'):
    optimizer = fedopt.build_server_optimizer('adamw', 0.1, semantics=semantics, beta_1=0.8,
                                              tau=0.01)
    hparams = optimizer.get_hparams(optimizer.initialize(()))
    assert (float(hparams['learning_rate']), float(hparams['beta_1']),
            float(hparams['epsilon'])) == pytest.approx((0.1, 0.8, 0.01))


# ---------------------------------------------------------------------------
# Mime.
# ---------------------------------------------------------------------------

MIME_LR, MIME_MOMENTUM = 0.1, 0.9


def _base_optimizer():
  return tff.learning.optimizers.build_sgdm(MIME_LR, momentum=MIME_MOMENTUM)


@pytest.fixture(scope='module')
def tff_mimelite():
  return tff.learning.algorithms.build_weighted_mime_lite(
      at.model_fn, _base_optimizer(), tff.learning.optimizers.build_sgdm(1.0))


@pytest.fixture(scope='module')
def mimelite_process():
  return mimelite.build_mimelite(at.model_fn, _base_optimizer(), local_steps=K,
                                 fb_flops_per_example=7.0)


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64))))
             for u, v in zip(at.flat(a), at.flat(b)))


def test_mimelite_equals_tffs_mime_lite(clients, tff_mimelite, mimelite_process):
  # TFF's builder is given the K batches our round cycles each client's data to.
  ours, data, tff_data = mimelite_process, at.datasets(clients), at.datasets(clients, steps=K)
  state, ref_state = ours.initialize(), tff_mimelite.initialize()
  for r in range(ROUNDS):
    output, ref_output = ours.next(state, data), tff_mimelite.next(ref_state, tff_data)
    state, ref_state = output.state, ref_output.state
    # The same floating-point operations in the same order: bit-identical.
    assert _max_diff(at.trainable(ours, state), at.trainable(tff_mimelite, ref_state)) == 0.0, r
    assert _max_diff(state.finalizer['base'], ref_state.client_work[0]) == 0.0, r
  assert max(float(np.abs(a).max()) for a in at.flat(state.finalizer['base']['accumulator'])) > 1e-2
  train, ref_train = output.metrics['client_work']['train'], ref_output.metrics['client_work']['train']
  assert train['num_examples'] == ref_train['num_examples']
  assert train['loss'] == pytest.approx(ref_train['loss'], rel=1e-6)
  num_params = at.D * at.C + at.C
  cost = output.metrics['cost']
  assert cost['upload_bits_per_client'] == 32 * 2 * num_params  # Δ and the full gradient
  # x, the whole SGDm state (momentum buffer, learning_rate, momentum) and (η, K).
  assert cost['download_bits_per_client'] == 32 * (2 * num_params + 2) + layout.num_bits(
      layout.HPARAMS_TYPE)
  assert cost['client_steps'] == K * len(SIZES)
  examples = sum(len(y) for c in clients for _, y in at.np_batches(c, K))
  # K steps + the full-gradient pass over the same K batches, + 5|x| per step.
  assert cost['client_flops'] == pytest.approx(2 * 7.0 * examples + K * len(SIZES) * 5 * num_params)


PROX_MU, PROX_LR = 0.5, 0.1


def _prox_client_optimizer():
  return tff.learning.optimizers.build_sgdm(PROX_LR, momentum=0.5)


def _prox_process(mu, **kwargs):
  # The recipe, not `build_fedprox` (which refuses μ < 0): TFF's sign is −μ here.
  recipe = fedprox.fedprox_recipe(_prox_client_optimizer(), tff.learning.optimizers.build_sgdm(1.0),
                                  mu, ops_per_param=11.0)
  return composer.build_process(at.model_fn, recipe, client_learning_rate=PROX_LR,
                                local_steps=K, fb_flops_per_example=7.0, **kwargs)


def _prox_round_distance(process, data):
  state = process.initialize()
  x0 = at.trainable(process, state)
  return at.max_abs_diff(at.trainable(process, process.next(state, data).state), x0)


def test_fedprox_is_tffs_fed_prox_with_the_papers_sign(clients):
  """TFF's client adds μ(x_t − y), the gradient of −(μ/2)‖y − x_t‖²: our recipe at
  −μ is TFF's at μ, bit for bit; at +μ (the paper's sign) the proximal term
  pulls the clients towards x_t."""
  tff_fedprox = tff.learning.algorithms.build_weighted_fed_prox(
      at.model_fn, PROX_MU, _prox_client_optimizer(), tff.learning.optimizers.build_sgdm(1.0))
  tffs_sign = _prox_process(-PROX_MU)
  data, tff_data = at.datasets(clients), at.datasets(clients, steps=K)
  state, ref_state = tffs_sign.initialize(), tff_fedprox.initialize()
  x0 = at.trainable(tffs_sign, state)
  for r in range(ROUNDS):
    state = tffs_sign.next(state, data).state
    ref_state = tff_fedprox.next(ref_state, tff_data).state
    assert _max_diff(at.trainable(tffs_sign, state),
                     at.trainable(tff_fedprox, ref_state)) == 0.0, r
  assert _max_diff(at.trainable(tffs_sign, state), x0) > 1e-2
  ours = fedprox.build_fedprox(at.model_fn, _prox_client_optimizer(), proximal_strength=PROX_MU,
                               local_steps=K, fb_flops_per_example=7.0)
  output = ours.next(ours.initialize(), data)
  moved = at.max_abs_diff(at.trainable(ours, output.state), x0)
  assert moved < _prox_round_distance(_prox_process(0.0), data) < _prox_round_distance(
      tffs_sign, data)
  # μ is state (`client_work`), not a constant of the program: set to TFF's sign, the
  # process built with +μ runs TFF's round bit for bit.
  hparams = ours.get_hparams(ours.initialize())
  hparams['client_work']['proximal_strength'] = np.float32(-PROX_MU)
  assert _max_diff(at.trainable(ours, ours.next(ours.set_hparams(ours.initialize(), hparams),
                                                data).state),
                   at.trainable(tff_fedprox, tff_fedprox.next(tff_fedprox.initialize(),
                                                               tff_data).state)) == 0.0
  num_params = at.D * at.C + at.C
  cost = output.metrics['cost']
  assert cost['upload_bits_per_client'] == 32 * num_params
  # SGDm's 8 ops per parameter (adapters) and the proximal term's 3.
  assert cost['client_flops'] == pytest.approx(
      7.0 * sum(len(y) for c in clients for _, y in at.np_batches(c, K)) +
      K * len(SIZES) * 11 * num_params)


@pytest.fixture(scope='module')
def mimexlite_process():
  return mimexlite.build_mimexlite(at.model_fn, _base_optimizer(), local_steps=1)


def test_mimexlite_k1_equals_tff_mimelite(tff_mimelite, mimexlite_process):
  # One batch per client (n_i ≤ B) and K = 1: the one-minibatch "full"
  # gradient is the full gradient and TFF's Mimelite runs one step on it.
  one_batch = at.make_clients((4, 3, 2), seed=3)
  process = mimexlite_process
  state, ref_state = process.initialize(), tff_mimelite.initialize()
  data = at.datasets(one_batch)
  for r in range(2):
    state = process.next(state, data).state
    ref_state = tff_mimelite.next(ref_state, data).state
    at.assert_close(at.trainable(process, state), at.trainable(tff_mimelite, ref_state),
                    rtol=1e-6, atol=1e-7, what=f'round {r + 1}')
  # TFF's Mime keeps (base optimiser state, aggregator state) as client-work state.
  ours_accumulator = at.flat(state.finalizer['base']['accumulator'])
  assert len(ours_accumulator) == 2
  at.assert_close(ours_accumulator, at.flat(ref_state.client_work[0]['accumulator']), rtol=1e-5,
                  atol=1e-7)
  assert max(float(np.abs(a).max()) for a in ours_accumulator) > 1e-2


def test_mimexlite_uploads_one_minibatch_gradient(clients, mimexlite_process):
  process = mimexlite_process
  state = layout.set_round_hparams(process.initialize(), local_steps=K)
  x0 = at.trainable(process, state)
  output = process.next(state, at.datasets(clients))
  # Server base state after one round: momentum accumulator = 0.9·0 + ḡ, ḡ the
  # example-weighted mean (weights: examples trained) of each client's FIRST
  # minibatch gradient at x_t.
  first = [at.np_grad(x0, *at.np_batches(c, K)[0]) for c in clients]
  examples = [sum(len(y) for _, y in at.np_batches(c, K)) for c in clients]
  expected = at.weighted_mean(first, examples)
  accumulator = at.flat(output.state.finalizer['base']['accumulator'])
  at.assert_close(accumulator, expected, rtol=1e-5, atol=1e-7)
  # Not the mean over all K batches at x_t (what a full-gradient Mime on the
  # round's data would upload).
  full = at.weighted_mean(
      [at.weighted_mean([at.np_grad(x0, xb, yb) for xb, yb in at.np_batches(c, K)],
                        [len(yb) for _, yb in at.np_batches(c, K)]) for c in clients], examples)
  assert at.max_abs_diff(full, expected) > 1e-2
  cost = output.metrics['cost']
  num_params = at.D * at.C + at.C
  assert cost['upload_bits_per_client'] == 32 * 2 * num_params
  assert cost['client_steps'] == K * len(SIZES)


# ---------------------------------------------------------------------------
# FLOPs: FedGBO paper Table B.2's CIFAR100 row.
# ---------------------------------------------------------------------------


def test_fedgbo_papers_sgdm_is_tffs_heavy_ball_at_rate_times_one_minus_beta():
  """--client_beta_1's help: SGDm of fedgbo/mfl (m ← βm + (1−β)g, step η·m)
  and TFF's heavy ball (m ← βm + g) at η(1−β) give the same iterates, both as
  moving steps (MFL, FedAvg's clients) and with the state fixed (FedGBO,
  Mimelite's client steps from the server's m)."""
  eta, beta = 1.0, 0.9
  rng = np.random.default_rng(3)
  grads = [[tf.constant(rng.standard_normal(4), tf.float32)] for _ in range(6)]
  ours = biased_optimizers.BiasedOptimizer('sgdm', beta_1=beta)
  heavy_ball = tff.learning.optimizers.build_sgdm(eta * (1 - beta), momentum=beta)
  x_ours = x_tff = [tf.zeros(4)]
  state = ours.init([tf.TensorSpec([4], tf.float32)])
  tff_state = heavy_ball.initialize([tf.TensorSpec([4], tf.float32)])
  for g in grads:
    state, direction = ours.moving_step(state, g)
    x_ours = [x - eta * d for x, d in zip(x_ours, direction)]
    tff_state, x_tff = heavy_ball.next(tff_state, x_tff, g)
    np.testing.assert_allclose(x_ours[0], x_tff[0], rtol=1e-5, atol=1e-6)
  # State fixed: U(g, m) = βm + (1−β)g at η, against η(1−β)·(β·m_hb + g) with
  # m = (1−β)·m_hb, TFF's momentum after the same gradients.
  fixed = ours.fixed_direction(state, grads[0])
  m_hb = tff_state['accumulator']
  np.testing.assert_allclose(np.asarray(state['m'][0]), (1 - beta) * np.asarray(m_hb[0]),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(eta * np.asarray(fixed[0]),
                             eta * (1 - beta) * (beta * np.asarray(m_hb[0]) + grads[0][0].numpy()),
                             rtol=1e-5, atol=1e-6)


def test_cifar100_flops_table_row():
  model = paper_cnns.create_cifar100_cnn()
  counts = flops.model_counts(model)
  assert (counts.num_params, counts.forward_flops) == (1_250_852, 5_163_072)
  row = {('fedavg', None, None): 49.8, ('fedgbo', 'sgdm', None): 50.2,
         ('mimelite', 'sgdm', 100): 65.7, ('mfl', 'adam', None): 50.9}
  got = {key: flops.client_flops(key[0], key[1], model, K=10, B=32, n_i=key[2]) / 1e8
         for key in row}
  for key, expected in row.items():
    assert flops.round_to_significant(got[key], 3) == pytest.approx(expected, abs=1e-9), key
  # Eq. 22 by hand for two cells: K(B·fb + C|x|) with fb = 3·forward.
  fb = 3 * 5_163_072
  assert got[('fedavg', None, None)] * 1e8 == 10 * (32 * fb + 2 * 1_250_852)
  assert got[('mfl', 'adam', None)] * 1e8 == 10 * (32 * fb + 11 * 1_250_852)
