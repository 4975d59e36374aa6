"""SCAFFOLD (Karimireddy et al. 2020, option II; docs/algorithms.md#scaffold) against a NumPy replay.

Every client trajectory, control variate and server step is recomputed in
NumPy (float64) on the linear-softmax model of `algorithm_testing`, from the
SPEC's equations (not from the implementation):

  client i:  y ← x;  K_i times: y ← y − η (g(y) − c_i + c)
             c_i⁺ = c_i − c + (x − y) / (K_i η);  Δy_i = y − x;  Δc_i = c_i⁺ − c_i
  server:    x ← x + η_g · mean Δy_i;  c ← c + |S|/N · mean Δc_i
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.algorithms import scaffold
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data

LR = 0.1
SERVER_LR = 0.7
SIZES = (7, 12, 5, 9)  # partial batches; the 5-example client cycles within a round
N = len(SIZES)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def clients():
  return at.make_clients(SIZES, seed=3)


def _zeros(x):
  return [np.zeros_like(a) for a in x]


def _np_round(x, c, controls, sampled, clients, steps, lr=LR, server_lr=SERVER_LR,
              total=N, example_weighted=False):
  """One SCAFFOLD round; `controls` (client → c_i) is updated in place.

  `example_weighted`: Δy averaged with the clients' example counts (Δc never).
  """
  dys, dcs = [], []
  for i in sampled:
    c_i = controls.get(i, _zeros(x))
    y = [a.copy() for a in x]
    batches = at.np_batches(clients[i], steps)
    for xb, yb in batches:
      g = at.np_grad(y, xb, yb)
      y = [w - lr * (gj - cij + cj) for w, gj, cij, cj in zip(y, g, c_i, c)]
    k_i = len(batches)
    c_new = [cij - cj + (xj - yj) / (k_i * lr) for cij, cj, xj, yj in zip(c_i, c, x, y)]
    dys.append([yj - xj for yj, xj in zip(y, x)])
    dcs.append([a - b for a, b in zip(c_new, c_i)])
    controls[i] = c_new
  ones = [1.0] * len(sampled)
  examples = [sum(len(yb) for _, yb in at.np_batches(clients[i], steps)) for i in sampled]
  mean_dy = at.weighted_mean(dys, examples if example_weighted else ones)
  mean_dc = at.weighted_mean(dcs, ones)
  x = [xj + server_lr * d for xj, d in zip(x, mean_dy)]
  c = [cj + len(sampled) / total * d for cj, d in zip(c, mean_dc)]
  return x, c


_PROCESSES = {}


def _process(steps, server_lr=SERVER_LR, total=N, **kwargs):
  key = (steps, server_lr, total, tuple(sorted(kwargs.items())))
  if key not in _PROCESSES:
    _PROCESSES[key] = scaffold.build_scaffold(
        at.model_fn, tff.learning.optimizers.build_sgdm(LR),
        tff.learning.optimizers.build_sgdm(server_lr), local_steps=steps, total_clients=total,
        **kwargs)
  return _PROCESSES[key]


def _run(process, state, clients, sampled, controls):
  """`process.next` on the sampled clients with their stored c_i; stores the new ones."""
  data = at.datasets([clients[i] for i in sampled])
  inputs = [process.client_input(d, controls.get(i, process.client_state_initial))
            for i, d in zip(sampled, data)]
  output = process.next(state, inputs)
  for i, out in zip(sampled, output.clients):
    controls[i] = out
  return output


def _control(state):
  return at.flat(scaffold.server_control(state))


def _client_control(value):
  return [np.asarray(v, np.float64) for v in value.values()]


@pytest.mark.parametrize('steps', [3, 0])  # K = 3 (cycling), one epoch (K_i = ⌈n_i/B⌉)
def test_three_rounds_equal_numpy_with_a_client_sampled_twice(clients, steps):
  process = _process(steps)
  state = process.initialize()
  x = at.trainable(process, state)
  c = _zeros(x)
  at.assert_close(_control(state), c, what='c_0 = 0')
  np_controls, tff_controls = {}, {}
  for r, sampled in enumerate([(0, 1), (2, 1), (3, 0)]):  # clients 1 and 0 return
    output = _run(process, state, clients, sampled, tff_controls)
    state = output.state
    x, c = _np_round(x, c, np_controls, sampled, clients, steps)
    at.assert_close(at.trainable(process, state), x, rtol=1e-5, atol=1e-5, what=f'x round {r}')
    at.assert_close(_control(state), c, rtol=1e-5, atol=1e-5, what=f'c round {r}')
    for i in sampled:
      at.assert_close(_client_control(tff_controls[i]), np_controls[i], rtol=1e-5, atol=1e-5,
                      what=f'c_{i} round {r}')
  # The returning clients' corrections mattered: c_i ≠ 0 and c ≠ 0.
  assert at.max_abs_diff(np_controls[1], _zeros(x)) > 1e-2
  assert at.max_abs_diff(c, _zeros(x)) > 1e-3


@pytest.mark.parametrize('variant', ['example_weighted', 'aggregator'])
def test_weighted_dy_and_a_composed_aggregator_keep_c_the_sum_over_n(clients, variant):
  """Δy example-weighted (the FedOpt paper's weighting), or through a `model_aggregator`
  (the round's composed path): c still moves by Σ Δc_i / N."""
  if variant == 'example_weighted':
    process = _process(3, client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES)
  else:
    process = _process(3, model_aggregator=tff.aggregators.UnweightedMeanFactory())
  state = process.initialize()
  x = at.trainable(process, state)
  c, np_controls, tff_controls = _zeros(x), {}, {}
  for r, sampled in enumerate([(0, 1), (2, 1)]):
    state = _run(process, state, clients, sampled, tff_controls).state
    x, c = _np_round(x, c, np_controls, sampled, clients, 3,
                     example_weighted=variant == 'example_weighted')
    at.assert_close(at.trainable(process, state), x, rtol=1e-5, atol=1e-5, what=f'x round {r}')
    at.assert_close(_control(state), c, rtol=1e-5, atol=1e-5, what=f'c round {r}')


def test_a_round_without_stored_controls_differs(clients):
  """The check above can fail: forgetting c_1 between rounds changes round 2."""
  process = _process(3)
  state = process.initialize()
  controls = {}
  state = _run(process, state, clients, (0, 1), controls).state
  kept = _run(process, state, clients, (2, 1), dict(controls)).state
  forgotten = _run(process, state, clients, (2, 1), {}).state
  assert at.max_abs_diff(at.trainable(process, kept), at.trainable(process, forgotten)) > 1e-4


@pytest.mark.parametrize('steps', [1, 3])
def test_first_round_is_fedavgs_with_the_server_learning_rate(clients, steps):
  """c = c_i = 0: the first round is FedAvg's (unweighted mean, server SGD η_g), any K."""
  process = _process(steps)
  fedavg = tff.learning.algorithms.build_unweighted_fed_avg(
      at.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(SERVER_LR))
  sampled = (0, 2, 3)
  output = _run(process, process.initialize(), clients, sampled, {})
  reference = fedavg.next(fedavg.initialize(),
                          at.datasets([clients[i] for i in sampled], steps=steps))
  at.assert_close(at.trainable(process, output.state),
                  at.flat(fedavg.get_model_weights(reference.state).trainable),
                  rtol=1e-5, atol=1e-6)


def test_full_participation_keeps_c_the_mean_of_the_client_controls(clients):
  """η_g = 1 and S = all N clients every round: c = mean_i c_i after every round."""
  process = _process(2, server_lr=1.0)
  state, controls = process.initialize(), {}
  for _ in range(2):
    state = _run(process, state, clients, tuple(range(N)), controls).state
    mean = at.weighted_mean([_client_control(controls[i]) for i in range(N)], [1.0] * N)
    at.assert_close(_control(state), mean, rtol=1e-5, atol=1e-6)


def test_costs_down_x_and_c_up_two_models(clients):
  process = _process(3)
  output = _run(process, process.initialize(), clients, (0, 1), {})
  num_params = at.D * at.C + at.C
  cost = output.metrics['cost']
  hparam_bits = 64  # η (float32) and K (int32) go down with x and c
  assert cost['download_bits_per_client'] == 32 * 2 * num_params + hparam_bits
  assert cost['upload_bits_per_client'] == 32 * 2 * num_params  # Δy and Δc
  assert cost['upload_bits'] == 2 * 32 * 2 * num_params
  assert cost['client_steps'] == 2 * 3


def test_bad_arguments_name_themselves():
  with pytest.raises(ValueError, match='total_clients'):
    scaffold.build_scaffold(at.model_fn, tff.learning.optimizers.build_sgdm(LR), local_steps=1,
                            total_clients=0)
  with pytest.raises(ValueError, match='plain SGD'):
    scaffold.build_scaffold(at.model_fn, tff.learning.optimizers.build_adam(LR), local_steps=1,
                            total_clients=3)


_COHORTS = {}


def _cohort_process(steps, mode='auto', in_process=True):
  key = (steps, mode, in_process)
  if key not in _COHORTS:
    _COHORTS[key] = scaffold.build_scaffold(
        at.model_fn, tff.learning.optimizers.build_sgdm(LR),
        tff.learning.optimizers.build_sgdm(SERVER_LR), local_steps=steps, total_clients=N,
        execution=cohort.CohortExecution(mode=mode, in_process=in_process))
  return _COHORTS[key]


def _run_cohort(process, state, clients, sampled, controls, steps):
  """`_run` for the cohort process: padded shards with the sampled clients' c_i."""
  data = at.datasets([clients[i] for i in sampled])
  shards = process.make_shards([cohort_data.client_batches(d, steps) for d in data])
  states = [controls.get(i, process.client_state_initial) for i in sampled]
  output = process.next(state, process.with_client_states(shards, states))
  for i, out in zip(sampled, output.clients):
    controls[i] = out
  return output


@pytest.mark.parametrize('steps,mode,in_process', [
    (3, 'vectorized', True), (0, 'vectorized', True), (0, 'sequential', True),
    (0, 'sequential', False)])  # the last through TFF's executor
def test_cohort_equals_numpy_and_per_client_with_clients_sampled_twice(clients, steps, mode,
                                                                        in_process):
  """Three cohort rounds against the NumPy replay and the per-client process. In
  epoch rounds (K = 0) the clients' step counts differ, so the shards hold them
  in another order than sampled: each c_i⁺ must still come back to its client."""
  process, reference = _cohort_process(steps, mode, in_process), _process(steps)
  assert cohort.is_cohort(process)
  state, reference_state = process.initialize(), reference.initialize()
  x = at.trainable(process, state)
  c, np_controls, controls, reference_controls = _zeros(x), {}, {}, {}
  for r, sampled in enumerate([(0, 1, 2), (2, 1), (3, 0, 1)]):
    output = _run_cohort(process, state, clients, sampled, controls, steps)
    state = output.state
    reference_state = _run(reference, reference_state, clients, sampled, reference_controls).state
    x, c = _np_round(x, c, np_controls, sampled, clients, steps)
    for what, got, want in [('x', at.trainable(process, state), x), ('c', _control(state), c),
                            ('x per client', at.trainable(process, state),
                             at.trainable(reference, reference_state))]:
      at.assert_close(got, want, rtol=1e-5, atol=1e-5, what=f'{what} round {r}')
    for i in sampled:
      at.assert_close(_client_control(controls[i]), np_controls[i], rtol=1e-5, atol=1e-5,
                      what=f'c_{i} round {r}')
      at.assert_close(_client_control(controls[i]), _client_control(reference_controls[i]),
                      rtol=1e-5, atol=1e-5, what=f'c_{i} per client, round {r}')
    assert output.metrics['cost']['upload_bits_per_client'] == 32 * 2 * (at.D * at.C + at.C)
  assert at.max_abs_diff(np_controls[1], _zeros(x)) > 1e-2


def test_cohort_rounds_need_the_client_states(clients):
  process = _cohort_process(3, 'vectorized')
  data = at.datasets([clients[i] for i in (0, 1)])
  shards = process.make_shards([cohort_data.client_batches(d, 3) for d in data])
  with pytest.raises(ValueError, match='with_client_states'):
    process.next(process.initialize(), shards)
  with pytest.raises(ValueError, match='1 client states for shards of 2 clients'):
    process.with_client_states(shards, [process.client_state_initial])


def test_upload_compression_is_refused_in_both_executions():
  for execution in ('per_client', 'cohort'):
    with pytest.raises(ValueError, match='upload_compression'):
      scaffold.build_scaffold(
          at.model_fn, tff.learning.optimizers.build_sgdm(LR), local_steps=1, total_clients=N,
          upload_compression=tff.aggregators.MeanFactory(), execution=execution)
