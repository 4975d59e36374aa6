"""The cohort on TFF workers with each shard's data built on its worker from ids.

Two loopback `worker_binary`s (tests/test_workers.py's `pool`) stand in for two
machines. Each round the driver sends each worker one shard's client ids; the
worker builds the padded shard in the graph (`cohort_data.shard_from_ids`, the
task's own dataset function and preprocessing) and returns its weighted sums,
merged once. Over 3 rounds on digits clients of unequal sizes with partial
batches, weights and metrics equal the in-process cohort and the per-client run
within 1e-5, for K-step and epoch-based rounds.
"""

import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import (
    mergeable_comp_execution_context as mergeable)

# pylint: disable=g-bad-import-order
import train_config
from test_cohort import _assert_outputs_equal
from test_workers import live_pool, pool  # pylint: disable=unused-import

from tasks import digits
from workflow.flags import library_flags
from workflow.training import cli
from tff_adaptive.algorithms import fedopt
from tff_adaptive.execution import data_on_workers
from tff_adaptive.execution import remote_context
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

WORKERS = 2
ROUNDS = 3
B = 64  # digits clients (8 of 111-285 examples) end in partial batches; K=3 cycles through one
IDS = [f'client_000{i}' for i in (0, 1, 3, 4, 6)]  # 78-285 examples; shards of 3 + 2


@pytest.fixture(scope='module')
def task():
  return digits.create_task(num_clients=8, batch_size=B)


def _clients_placed_types(type_spec) -> list:
  """The member types of the CLIENTS-placed parts of a parameter type."""
  if isinstance(type_spec, tff.FederatedType):
    return [type_spec.member] if type_spec.placement is tff.CLIENTS else []
  if isinstance(type_spec, tff.StructType):
    return [t for _, member in structure.iter_elements(type_spec)
            for t in _clients_placed_types(member)]
  return []


@pytest.fixture
def sent_types(monkeypatch):
  """The CLIENTS-placed types of what the mergeable context sends each worker."""
  sent = []
  up_to_merge = mergeable._invoke_up_to_merge_and_return_context

  async def spy(comp, arg, context):
    sent.append(_clients_placed_types(comp.up_to_merge.type_signature.parameter))
    return await up_to_merge(comp, arg, context)

  monkeypatch.setattr(mergeable, '_invoke_up_to_merge_and_return_context', spy)
  return sent


_BUILT = {}


def _build(task, local_steps, execution='per_client'):
  """FedAdam on the digits MLP, built once per module for each (K, execution): every
  task of this file has that model, so one build (its traces) serves every test."""
  key = (local_steps, repr(execution))
  if key not in _BUILT:
    _BUILT[key] = fedopt.build_fedadam(task.model_fn, tff.learning.optimizers.build_sgdm(0.1),
                                       0.05, local_steps=local_steps, execution=execution)
  return _BUILT[key]


@pytest.mark.parametrize('local_steps', [3, 0])
def test_shards_built_on_workers_equal_in_process_and_per_client(
    local_cpp_context, live_pool, sent_types, task, local_steps):
  del local_cpp_context  # the per-client and in-process runs' context
  datasets = task.client_train_datasets(IDS)
  batches = [cohort_data.client_batches(ds, local_steps) for ds in datasets]
  rows = [b[-1]['y'].shape[0] for b in batches]
  assert min(rows) < B, 'the case must train on a partial batch'
  assert len({len(b) for b in batches}) > 1 or local_steps > 0, 'unequal clients'

  per_client = _build(task, local_steps)
  in_process = _build(task, local_steps, 'cohort')
  on_workers = data_on_workers.compose_cohort_data_on_workers(
      _build(task, local_steps, cohort.CohortExecution(in_process=False, num_shards=WORKERS)),
      task)
  # Only ids go to the workers: the CLIENTS-placed argument is a vector of strings.
  assert on_workers.next.type_signature.parameter[1].member == data_on_workers.SHARD_IDS_TYPE
  shard_ids = data_on_workers.shard_ids_fn(WORKERS)(IDS, None)
  assert [list(s) for s in shard_ids] == [IDS[:3], IDS[3:]]

  context = remote_context.create_workers_context([w.address for w in live_pool])
  local_state = in_process_state = remote_state = per_client.initialize()
  for r in range(ROUNDS):
    expected = per_client.next(local_state, datasets)
    fast = in_process.next(in_process_state, in_process.make_shards(batches))
    with context_stack_impl.context_stack.install(context):
      remote = on_workers.next(remote_state, shard_ids)
    what = f'K={local_steps} round {r + 1}'
    _assert_outputs_equal(expected, fast, f'{what}: in-process cohort vs per client')
    _assert_outputs_equal(fast, remote, f'{what}: data on 2 workers vs in-process cohort')
    _assert_outputs_equal(expected, remote, f'{what}: data on 2 workers vs per client')
    local_state, in_process_state, remote_state = expected.state, fast.state, remote.state

  # Each worker, each round, received string ids and nothing else per client.
  assert sent_types == [[data_on_workers.SHARD_IDS_TYPE]] * (WORKERS * ROUNDS)
  # Not trivially equal: training moved the weights well beyond the tolerance.
  initial = per_client.get_model_weights(per_client.initialize()).trainable
  final = per_client.get_model_weights(remote_state).trainable
  assert max(np.max(np.abs(np.asarray(a) - np.asarray(b))) for a, b in zip(initial, final)) > 1e-2


def test_shard_from_ids_pads_as_the_driver_does(task):
  """The graph-built shard holds the driver's `cohort_data.shards`, client by client."""
  for local_steps in (3, 0):
    built = tf.function(lambda ids, k: cohort_data.shard_from_ids(
        ids, k, lambda cid: task.preprocess_train(task.train_data.serializable_dataset_fn(cid), cid)))(
            tf.constant(IDS), tf.constant(local_steps))
    batches = [cohort_data.client_batches(ds, local_steps)
               for ds in task.client_train_datasets(IDS)]
    for c, client in enumerate(batches):
      (expected,) = cohort_data.shards([client])
      steps, rows = expected['mask'].shape[1:]
      assert np.all(built['mask'][c, steps:] == 0) and np.all(built['mask'][c, :, rows:] == 0)
      np.testing.assert_array_equal(built['mask'][c, :steps, :rows], expected['mask'][0])
      for key in ('x', 'y'):
        np.testing.assert_array_equal(built['batches'][key][c, :steps, :rows],
                                      expected['batches'][key][0])
    longest = max(len(b) for b in batches)
    assert built['mask'].shape[:2] == (len(IDS), local_steps or longest)

  # A client without data: no steps of its own (all-zero masks), the others unchanged;
  # a shard of only such clients has no steps at all.
  dataset_fn = task.train_data.serializable_dataset_fn
  no_data = lambda cid: tf.where(tf.equal(cid, IDS[1]), tf.constant(0, tf.int64), -1)
  some_empty = tf.function(lambda ids: cohort_data.shard_from_ids(
      ids, 3, lambda cid: task.preprocess_train(dataset_fn(cid), cid).take(no_data(cid))))
  built = some_empty(tf.constant(IDS))
  assert np.sum(built['mask'][1]) == 0 and built['mask'].shape[1] == 3
  assert [np.sum(built['mask'][c]) > 0 for c in range(len(IDS))] == [True, False, True, True, True]
  assert some_empty(tf.constant(IDS[1:2]))['mask'].shape == (1, 0, 0)


def test_bin_train_builds_the_shards_on_the_workers(live_pool, tmp_path, capsys):
  """bin/train --workers --data_on_workers --execution=cohort: ids out, same run as data sent."""
  addresses = ','.join(w.address for w in live_pool)
  run = lambda name, **flags: cli.run_training(train_config.small_run(
      tmp_path, name, num_clients=8, clients_per_round=5, total_rounds=2, rounds_per_eval=2,
      rounds_per_checkpoint=2, workers=addresses, show_progress=True, cohort_mode='auto',
      **flags))[0]
  sent = run('sent')
  assert 'one shard per TFF worker)' in capsys.readouterr().err
  built = run('built', data_on_workers=True)
  err = capsys.readouterr().err
  assert ('execution: cohort (one compiled program per round, clients vectorised, one shard per '
          'TFF worker, its data built on the worker from client ids)') in err, err
  for a, b in zip(tf.nest.flatten(sent), tf.nest.flatten(built), strict=True):
    np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64),
                               rtol=1e-5, atol=1e-5)


def test_batches_of_varying_shapes_are_refused_at_build(task):
  """Batches whose shapes after the rows vary cannot be padded into one shard: one line."""
  process = _build(task, 3, cohort.CohortExecution(in_process=False, num_shards=WORKERS))
  varying = types.SimpleNamespace(
      name='varying', preprocess_train=lambda ds, cid: ds, train_data=types.SimpleNamespace(
          serializable_dataset_fn=lambda cid: tf.data.Dataset.from_tensors(
              {'x': tf.zeros([2, tf.strings.length(cid), 1]), 'y': tf.zeros([2], tf.int32)})))
  with pytest.raises(ValueError) as raised:
    data_on_workers.compose_cohort_data_on_workers(process, varying)
  assert library_flags.flag_message(raised.value).startswith(
      '--data_on_workers: task varying: its batches cannot be padded into one shard'), raised.value
  with pytest.raises(ValueError, match='runs in process'):
    data_on_workers.compose_cohort_data_on_workers(_build(task, 3, 'cohort'), task)


def test_shards_built_in_computation_follow_trainer_global_seed(local_cpp_context):
  """With `tf.random.set_seed`, eager shuffles change; the workers' shards follow them."""
  del local_cpp_context  # any TFF context runs the composed process; no workers needed
  tf.random.set_seed(9)
  try:
    task = digits.create_task(num_clients=8, batch_size=B)
    batches = [cohort_data.client_batches(ds, 3) for ds in task.client_train_datasets(IDS)]
    in_process = _build(task, 3, 'cohort')
    composed = data_on_workers.compose_cohort_data_on_workers(
        _build(task, 3, cohort.CohortExecution(in_process=False, num_shards=WORKERS)), task)
    state = in_process.initialize()
    expected = in_process.next(state, in_process.make_shards(batches))
    actual = composed.next(state, data_on_workers.shard_ids_fn(WORKERS)(IDS, None))
    _assert_outputs_equal(expected, actual, 'global seed 9: built in the computation vs eager')
  finally:
    tf.random.set_seed(None)


def test_clients_without_data_add_nothing(local_cpp_context):
  """A client without data, in a shard with others or alone: the per-client round's result."""
  del local_cpp_context  # the composed process runs under any TFF context
  task = digits.create_task(num_clients=8, batch_size=B)
  dataset_fn = task.train_data.serializable_dataset_fn
  # IDS[0] has no examples (graph-safe comparison: TFF traces in graph mode).
  emptied = lambda cid: dataset_fn(cid).take(
      tf.where(tf.equal(cid, IDS[0]), tf.constant(0, tf.int64), -1))
  with_empty = types.SimpleNamespace(
      name='with_empty', preprocess_train=task.preprocess_train,
      train_data=types.SimpleNamespace(serializable_dataset_fn=emptied))
  per_client = _build(task, 3)
  composed = data_on_workers.compose_cohort_data_on_workers(
      _build(task, 3, cohort.CohortExecution(in_process=False, num_shards=WORKERS)), with_empty)
  state = per_client.initialize()
  ids = IDS[:3]
  expected = per_client.next(
      state, [task.preprocess_train(emptied(tf.constant(cid)), cid) for cid in ids])
  for shards in ([ids[:1], ids[1:]], [ids[:2], ids[2:]]):
    actual = composed.next(state, [np.array(s, dtype=object) for s in shards])
    _assert_outputs_equal(expected, actual, f'shards {shards}')
