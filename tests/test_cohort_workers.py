"""The cohort execution on TFF workers: one shard per worker, one reduce per round.

Two loopback `worker_binary`s (tests/test_workers.py's `pool`) stand in for two
machines. The cohort is padded on the coordinator into exactly one shard per
worker; TFF's mergeable context hands each worker one CLIENTS member (a shard),
each worker returns that shard's weighted sums, and they are merged once. Over 3
rounds the weights and train metrics equal the in-process cohort run and the
per-client local run within 1e-5.
"""

import numpy as np
import pytest
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import (
    mergeable_comp_execution_context as mergeable)

# pylint: disable=g-bad-import-order
from test_cohort import BUILDERS, _assert_outputs_equal, client_datasets
from test_workers import live_pool, pool  # pylint: disable=unused-import

from tff_adaptive.execution import remote_context
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

WORKERS = 2
ROUNDS = 3


def _clients_members(type_spec, value) -> list[int]:
  """How many CLIENTS members each non-all-equal CLIENTS-placed part of `value` has."""
  if isinstance(type_spec, tff.FederatedType):
    return [len(value)] if type_spec.placement is tff.CLIENTS and not type_spec.all_equal else []
  if isinstance(type_spec, tff.StructType):
    elements = structure.iter_elements(structure.from_container(value))
    return [n for (_, v), (_, t) in zip(elements, structure.iter_elements(type_spec))
            for n in _clients_members(t, v)]
  return []


@pytest.fixture
def subrounds(monkeypatch):
  """Records what the mergeable context sends: [(worker context, shards)], and merges."""
  calls = {'up_to_merge': [], 'merges': 0}
  up_to_merge, merge = mergeable._invoke_up_to_merge_and_return_context, mergeable._merge_results

  async def spy_up_to_merge(comp, arg, context):
    members = _clients_members(comp.up_to_merge.type_signature.parameter, arg)
    calls['up_to_merge'].append((context, members))
    return await up_to_merge(comp, arg, context)

  async def spy_merge(*args):
    calls['merges'] += 1
    return await merge(*args)

  monkeypatch.setattr(mergeable, '_invoke_up_to_merge_and_return_context', spy_up_to_merge)
  monkeypatch.setattr(mergeable, '_merge_results', spy_merge)
  return calls


# (algorithm, K, client sizes): grouped by size, K=0 over these 5 clients (2, 4, 1, 3
# and 1 batches) makes 3 shards, K=3 (3 steps each) one: both are sent as 2
# (K=0: the 2 longest clients in one, padded to 2 x 4 steps; 3 x 2 in the other).
CASES = [('fedavg', 0, (7, 13, 3, 10, 2)), ('fedadam', 3, (7, 13, 3, 10))]


def _client_batches(datasets, local_steps):
  return [cohort_data.client_batches(ds, local_steps) for ds in datasets]


@pytest.mark.parametrize('name,local_steps,sizes', CASES)
def test_cohort_on_two_workers_equals_in_process_and_per_client(
    local_cpp_context, live_pool, subrounds, name, local_steps, sizes):
  del local_cpp_context  # the per-client and in-process runs' context
  datasets = client_datasets(sizes)
  batches = _client_batches(datasets, local_steps)
  by_size = len(cohort_data.group_by_size(batches))
  assert by_size != WORKERS, 'the case must need shards other than the grouping by size'

  per_client = BUILDERS[name](local_steps=local_steps)
  in_process = BUILDERS[name](local_steps=local_steps, execution='cohort')
  on_workers = BUILDERS[name](local_steps=local_steps, execution=cohort.CohortExecution(
      in_process=False, num_shards=WORKERS))
  assert isinstance(on_workers, cohort.CohortProcess)
  assert on_workers.next.runs is on_workers.tff_next  # the TFF computation, run by the context
  # One reduce per round: the shards' weighted sums meet in a single federated_sum.
  assert str(on_workers.tff_next.to_building_block()).count('federated_sum') == 1

  context = remote_context.create_workers_context([w.address for w in live_pool])
  local_state = in_process_state = remote_state = per_client.initialize()
  for r in range(ROUNDS):
    expected = per_client.next(local_state, datasets)
    fast = in_process.next(in_process_state, in_process.make_shards(batches))
    shards = on_workers.make_shards(batches)
    assert len(shards) == WORKERS
    with context_stack_impl.context_stack.install(context):
      remote = on_workers.next(remote_state, shards)
    what = f'{name} K={local_steps} round {r + 1}'
    _assert_outputs_equal(expected, fast, f'{what}: in-process cohort vs per client')
    _assert_outputs_equal(expected, remote, f'{what}: cohort on 2 workers vs per client')
    local_state, in_process_state, remote_state = expected.state, fast.state, remote.state

  # Each round: one shard to each worker, one merge of their two partial sums.
  sent = subrounds['up_to_merge']
  assert [members for _, members in sent] == [[1]] * (WORKERS * ROUNDS)
  for r in range(ROUNDS):
    assert len({id(c) for c, _ in sent[WORKERS * r:WORKERS * (r + 1)]}) == WORKERS
  assert subrounds['merges'] == ROUNDS

  # Fewer clients than workers: one shard, one worker, nothing to merge (no
  # empty stand-in client: under uniform weighting it would count).
  one = client_datasets(sizes[:1])
  shards = on_workers.make_shards(_client_batches(one, local_steps))
  assert len(shards) == 1
  with context_stack_impl.context_stack.install(context):
    remote = on_workers.next(remote_state, shards)
  _assert_outputs_equal(per_client.next(local_state, one), remote, f'{name}: one client')
  assert [members for _, members in sent[WORKERS * ROUNDS:]] == [[1]]
  assert subrounds['merges'] == ROUNDS
  # Not trivially equal: training moved the weights well beyond the tolerance.
  initial = per_client.get_model_weights(per_client.initialize()).trainable
  final = on_workers.get_model_weights(remote_state).trainable
  assert max(np.max(np.abs(np.asarray(a) - np.asarray(b))) for a, b in zip(initial, final)) > 1e-2


def test_one_shard_per_worker_bounds_the_largest_shard():
  """A round on workers waits for the largest shard: padded work clients x longest steps."""
  assert cohort_data.split_evenly([4, 3, 2, 1, 1], 2) == [2, 3]  # 8 and 6, not 12 and 2
  assert cohort_data.split_evenly([3] * 7, 3) == [3, 2, 2]
  assert cohort_data.split_evenly([5, 0], 4) == [1, 1]  # never an empty shard
  clients = [[{'x': np.ones((2, 1))}] * n for n in (1, 4, 1, 2, 3)]
  assert cohort_data.group_by_size(clients, num_shards=2) == [[1, 4], [3, 0, 2]]
  assert len(cohort_data.shards(clients, num_shards=2)) == 2
