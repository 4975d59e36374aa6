"""Populations of algorithms whose clients keep state (rounds/population.py).

SCAFFOLD (each client's control variate c_i), FedDyn (each client's ∇L_i
term; no server rate: 2 × 2 seeds) and MTFL (each client's private batch-norm
values, and its user accuracy measured in the round; Per-FedAvg, whose clients
keep no state but return their user accuracy: 2 × 2 seeds): a 2 × 2 × 2 grid
(client η × server η × seed) whose members each keep their own clients'
states, as their own runs would. After 3 rounds every member's weights, server
statistics, train metrics and its clients' new states equal the same member's
own cohort run within 1e-5 relative. A client sampled twice comes back to the
state its member's previous round gave it, so a state that went to the wrong
member or the wrong client fails the next round.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
import test_mtfl as tm
from test_population import CLIENT_RATES, SEEDS, _assert_member_equal, _member_state  # pylint: disable=g-bad-import-order
from tff_adaptive.algorithms import feddyn
from tff_adaptive.algorithms import mtfl
from tff_adaptive.algorithms import perfedavg
from tff_adaptive.algorithms import scaffold
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import population
from workflow.training import program

ROUNDS = 3
SIZES = (7, 12, 5, 9)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


def _scaffold():
  process = scaffold.build_scaffold(
      at.model_fn, tff.learning.optimizers.build_sgdm(0.1),
      tff.learning.optimizers.build_sgdm(1.0), local_steps=3, total_clients=len(SIZES),
      execution=cohort.CohortExecution())
  datasets = at.datasets(at.make_clients(SIZES, seed=5))

  def inputs(ids, stored):
    return [process.client_input(datasets[i], stored.get(i, process.client_state_initial))
            for i in ids]

  return process, (1.0, 0.5), len(SIZES), inputs, lambda output: output


def _feddyn():
  process = feddyn.build_feddyn(at.model_fn, tff.learning.optimizers.build_sgdm(0.1), alpha=0.1,
                                local_steps=3, total_clients=len(SIZES),
                                execution=cohort.CohortExecution())
  datasets = at.datasets(at.make_clients(SIZES, seed=5))

  def inputs(ids, stored):
    return [process.client_input(datasets[i], stored.get(i, process.client_state_initial))
            for i in ids]

  return process, (None,), len(SIZES), inputs, lambda output: output


def _perfedavg():
  process = perfedavg.build_perfedavg(at.model_fn, tff.learning.optimizers.build_sgdm(0.05),
                                      beta=0.1, local_steps=3, execution=cohort.CohortExecution())
  datasets = at.datasets(at.make_clients(SIZES, seed=5))
  tests = at.datasets(at.make_clients(SIZES, seed=6))

  def inputs(ids, stored):
    del stored  # no private state: the round measures each client's user accuracy
    return [process.client_input(datasets[i], test=tests[i]) for i in ids]

  return process, (None,), len(SIZES), inputs, lambda output: output


def _mtfl():
  process = mtfl.build_mtfl(tm.bn_model_fn, tm.bn_keras_model,
                            tff.learning.optimizers.build_sgdm(0.1),
                            tff.learning.optimizers.build_adam(0.05), private='all',
                            strategy='fedadam', local_steps=3, execution=cohort.CohortExecution())
  task = tm.make_task()

  def inputs(ids, stored):
    names = [tm.IDS[i] for i in ids]
    tests = [task.baseline.datasets.eval_preprocess_fn(
        task.test_client_data.create_tf_dataset_for_client(c)) for c in names]
    return [process.client_input(d, stored.get(i, process.private_initial), test=t)
            for i, d, t in zip(ids, program.client_datasets(task, names, None), tests)]

  return process, (0.05, 0.02), len(tm.IDS), inputs, lambda output: output['private']


BUILDERS = {'scaffold': _scaffold, 'feddyn': _feddyn, 'mtfl': _mtfl, 'perfedavg': _perfedavg}


def _sampled(seed, round_num, clients):
  rng = np.random.default_rng([seed, round_num])
  return [int(i) for i in rng.choice(clients, 2, replace=False)]


def _assert_clients_equal(own, got, what):
  assert len(own) == len(got), what
  for j, (a, b) in enumerate(zip(own, got)):
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-7,
                                 err_msg=f'{what} client {j}')


@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_members_keep_their_own_clients_states(name):
  process, server_rates, clients, inputs, kept = BUILDERS[name]()
  grid = list(itertools.product(CLIENT_RATES, server_rates, SEEDS))
  alone = [_member_state(process, *member) for member in grid]
  stored_alone, stored = [{} for _ in grid], [{} for _ in grid]
  pop = population.build_population(process)
  state = pop.stack(alone)
  for round_num in range(ROUNDS):
    ids = [_sampled(seed, round_num, clients) for *_, seed in grid]
    output = pop.next(state, [inputs(i, s) for i, s in zip(ids, stored)])
    state = output.state
    for m in range(len(grid)):
      what = f'{name} member {grid[m]} round {round_num}'
      own = process.next(alone[m], inputs(ids[m], stored_alone[m]))
      alone[m] = own.state
      _assert_member_equal(own.state, own.metrics, state, output.metrics, m, what)
      _assert_clients_equal(own.clients, output.clients[m], what)
      own_member = population.member_output(output, m)
      assert own_member.clients is output.clients[m]
      for i, a, b in zip(ids[m], own.clients, output.clients[m]):
        stored_alone[m][i], stored[m][i] = kept(a), kept(b)
  # The states moved: the equality above compared more than initial values.
  moved = [v for s in stored for out in s.values() for v in tf.nest.flatten(out)]
  assert max(float(np.max(np.abs(np.asarray(v)))) for v in moved) > 1e-3
