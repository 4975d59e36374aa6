"""FedDyn (Acar et al. 2021, Algorithm 1; docs/algorithms.md#feddyn) against a NumPy replay.

The replay follows the paper's Algorithm 1 as written (not the folded form the
client computes), in float64 on the linear-softmax model of `algorithm_testing`:

  client k ∈ P_t:  θ ← x;  K times: θ ← θ − η (∇L_k(θ) − λ_k + α (θ − x))
                   λ_k ← λ_k − α (θ − x)       (λ_k = ∇L_k(θ_k^{t−1}), 0 at first)
  server:          h ← h − α (1/m) Σ_{k∈P_t} (θ_k − x);   x ← (1/|P_t|) Σ θ_k − h/α
"""

import numpy as np
import pytest
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.algorithms import feddyn
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data

LR = 0.1
ALPHA = 0.05
SIZES = (7, 12, 5, 9)  # partial batches; the 5-example client cycles within a round
M = len(SIZES)
ROUNDS = [(0, 1), (2, 1), (3, 0)]  # partial participation; clients 1 and 0 return

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def clients():
  return at.make_clients(SIZES, seed=5)


def _np_round(x, h, lams, sampled, clients, steps):
  """One round of Algorithm 1; `lams` (client → λ_k) is updated in place."""
  thetas = []
  for k in sampled:
    lam = lams.get(k, [np.zeros_like(a) for a in x])
    theta = [a.copy() for a in x]
    for xb, yb in at.np_batches(clients[k], steps):
      g = at.np_grad(theta, xb, yb)
      theta = [t - LR * (gj - lj + ALPHA * (t - xj))
               for t, gj, lj, xj in zip(theta, g, lam, x)]
    lams[k] = [lj - ALPHA * (t - xj) for lj, t, xj in zip(lam, theta, x)]
    thetas.append(theta)
  h = [hj - ALPHA / M * sum(th[j] - x[j] for th in thetas) for j, hj in enumerate(h)]
  x = [sum(th[j] for th in thetas) / len(thetas) - h[j] / ALPHA for j in range(len(x))]
  return x, h


_PROCESSES = {}


def _process(steps, execution='per_client'):
  key = (steps, execution)
  if key not in _PROCESSES:
    _PROCESSES[key] = feddyn.build_feddyn(
        at.model_fn, tff.learning.optimizers.build_sgdm(LR), alpha=ALPHA, local_steps=steps,
        total_clients=M, execution=execution)
  return _PROCESSES[key]


def _run(process, state, clients, sampled, lams, steps):
  """One round on the sampled clients with their stored λ_k (the cohort: in shards)."""
  data = at.datasets([clients[i] for i in sampled])
  stored = [lams.get(i, process.client_state_initial) for i in sampled]
  if cohort.is_cohort(process):
    shards = process.make_shards([cohort_data.client_batches(d, steps) for d in data])
    output = process.next(state, process.with_client_states(shards, stored))
  else:
    output = process.next(state, [process.client_input(d, s) for d, s in zip(data, stored)])
  for i, out in zip(sampled, output.clients):
    lams[i] = out
  return output


def _values(flat_state):
  return [np.asarray(v, np.float64) for v in flat_state.values()]


@pytest.mark.parametrize('steps', [3, 0])  # K = 3 (cycling), one epoch
def test_three_rounds_equal_the_papers_algorithm_per_client_and_as_a_cohort(clients, steps):
  processes = {'per client': _process(steps), 'cohort': _process(steps, 'cohort')}
  assert cohort.is_cohort(processes['cohort'])
  states = {name: p.initialize() for name, p in processes.items()}
  x = at.trainable(processes['per client'], states['per client'])
  h, np_lams = [np.zeros_like(a) for a in x], {}
  lams = {name: {} for name in processes}
  for r, sampled in enumerate(ROUNDS):
    x, h = _np_round(x, h, np_lams, sampled, clients, steps)
    for name, process in processes.items():
      states[name] = _run(process, states[name], clients, sampled, lams[name], steps).state
      at.assert_close(at.trainable(process, states[name]), x, rtol=1e-5, atol=1e-5,
                      what=f'x {name} round {r}')
      at.assert_close(at.flat(feddyn.server_h(states[name])), h, rtol=1e-5, atol=1e-5,
                      what=f'h {name} round {r}')
      for i in sampled:
        at.assert_close(_values(lams[name][i]), np_lams[i], rtol=1e-5, atol=1e-5,
                        what=f'λ_{i} {name} round {r}')
    at.assert_close(at.trainable(processes['cohort'], states['cohort']),
                    at.trainable(processes['per client'], states['per client']),
                    rtol=1e-5, atol=1e-6, what=f'cohort vs per client round {r}')
  # The dynamic terms mattered: λ_1 and h moved away from 0.
  assert at.max_abs_diff(np_lams[1], [np.zeros_like(a) for a in x]) > 1e-3
  assert at.max_abs_diff(h, [np.zeros_like(a) for a in x]) > 1e-4


def test_forgetting_the_linear_terms_changes_the_round(clients):
  """The check above can fail: a client that loses λ_1 between rounds moves x elsewhere."""
  process = _process(3)
  state = process.initialize()
  lams = {}
  state = _run(process, state, clients, (0, 1), lams, 3).state
  kept = _run(process, state, clients, (2, 1), dict(lams), 3).state
  forgotten = _run(process, state, clients, (2, 1), {}, 3).state
  assert at.max_abs_diff(at.trainable(process, kept), at.trainable(process, forgotten)) > 1e-4


def test_costs_down_x_up_delta_and_the_count(clients):
  process = _process(3)
  output = _run(process, process.initialize(), clients, (0, 1), {}, 3)
  num_params = at.D * at.C + at.C
  cost = output.metrics['cost']
  assert cost['download_bits_per_client'] == 32 * num_params + 64  # x, η and K
  assert cost['upload_bits_per_client'] == 32 * num_params + 32
  assert cost['client_optimizer_state_floats'] == num_params  # s = λ_k + α x


@pytest.mark.parametrize('kwargs,match', [
    (dict(alpha=0.0), 'alpha'), (dict(alpha=-1.0), 'alpha'), (dict(total_clients=0), 'total_clients'),
    (dict(local_steps=-1), 'local_steps')])
def test_bad_arguments_name_themselves(kwargs, match):
  arguments = dict(alpha=ALPHA, local_steps=1, total_clients=M)
  arguments.update(kwargs)
  with pytest.raises(ValueError, match=match):
    feddyn.build_feddyn(at.model_fn, tff.learning.optimizers.build_sgdm(LR), **arguments)
