"""A population on TFF workers: each member's clients split over the workers.

Two loopback `worker_binary`s (tests/test_workers.py's `pool`) stand in for two
machines. A SCAFFOLD population (its clients keep their control variates, so
both the per-member sums and the per-client outputs cross the workers) built
on the cohort with `num_shards=2`: every round sends one shard, half of every
member's clients, to each worker. Over 3 rounds each member's weights, server
statistics, train metrics and clients' new states equal the same population
run in this process within 1e-5.
"""

import itertools

import pytest
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

# pylint: disable=g-bad-import-order
import algorithm_testing as at
from test_cohort_workers import subrounds  # pylint: disable=unused-import
from test_population import CLIENT_RATES, SEEDS, _assert_member_equal, _member_state
from test_population_stateful import _assert_clients_equal
from test_workers import live_pool, pool  # pylint: disable=unused-import

from tff_adaptive.algorithms import scaffold
from tff_adaptive.execution import remote_context
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import population

pytestmark = pytest.mark.slow

ROUNDS, SIZES, WORKERS = 3, (7, 12, 5, 9, 4), 2


def _scaffold(execution):
  return scaffold.build_scaffold(
      at.model_fn, tff.learning.optimizers.build_sgdm(0.1),
      tff.learning.optimizers.build_sgdm(1.0), local_steps=3, total_clients=len(SIZES),
      execution=execution)


def test_members_split_over_two_workers_equal_the_population_in_process(
    local_cpp_context, live_pool, subrounds):
  del local_cpp_context
  here = _scaffold(cohort.CohortExecution())
  there = _scaffold(cohort.CohortExecution(in_process=False, num_shards=WORKERS))
  datasets = at.datasets(at.make_clients(SIZES, seed=5))
  grid = list(itertools.product(CLIENT_RATES, SEEDS))
  start = population.stack([_member_state(here, lr, 1.0, seed) for lr, seed in grid])
  pops = {'here': population.build_population(here),
          'there': population.build_population(there)}
  states, stored = {k: start for k in pops}, {k: [{} for _ in grid] for k in pops}
  context = remote_context.create_workers_context([w.address for w in live_pool])
  for round_num in range(ROUNDS):
    # Three of five clients per member, different ones per member and round.
    ids = [[(m + round_num + j) % len(SIZES) for j in range(3)] for m in range(len(grid))]
    outputs = {}
    for key, pop in pops.items():
      data = [[pop.process.client_input(datasets[i],
                                        stored[key][m].get(i, pop.process.client_state_initial))
               for i in ids[m]] for m in range(len(grid))]
      if key == 'there':
        with context_stack_impl.context_stack.install(context):
          outputs[key] = pop.next(states[key], data)
      else:
        outputs[key] = pop.next(states[key], data)
      states[key] = outputs[key].state
      for m in range(len(grid)):
        for i, out in zip(ids[m], outputs[key].clients[m]):
          stored[key][m][i] = out
    for m in range(len(grid)):
      what = f'member {grid[m]} round {round_num}'
      here_member = population.member_output(outputs['here'], m)
      _assert_member_equal(here_member.state, here_member.metrics, states['there'],
                           outputs['there'].metrics, m, what)
      _assert_clients_equal(here_member.clients, outputs['there'].clients[m], what)
  # Every round: one shard to each worker.
  assert [members for _, members in subrounds['up_to_merge']] == [[1]] * (WORKERS * ROUNDS)
