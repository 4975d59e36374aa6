"""Workers build the client datasets from client ids.

`compose_data_on_workers` composes a learning process with a computation that
builds each client's dataset from its id
(`tff.simulation.compose_dataset_computation_with_learning_process`), so a
round sends ids instead of data; `client_ids_fn` is the training loop's
`client_data_fn` for such a process.

`compose_cohort_data_on_workers` does the same for the cohort execution on
TFF workers: each worker receives its shard's client ids, builds the padded
shard in the graph (`cohort_data.shard_from_ids`, the task's dataset function
and preprocessing, K from the broadcast state) and runs the cohort's shard
program on it; `shard_ids_fn` splits a round's ids into one shard per worker.
"""

from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.python.eager import context as eager_context

from tff_adaptive import errors
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data
from tff_adaptive.rounds import layout

# One shard's client ids: the CLIENTS-placed value a worker receives.
SHARD_IDS_TYPE = tff.TensorType(np.str_, [None])


def has_round_hparams(process) -> bool:
  """Whether `process` runs K local steps itself (`local_steps` in its state's client_work)."""
  return layout.runs_local_steps(process.initialize.type_signature.result)


def compose_data_on_workers(process, task, local_steps: Optional[int] = None):
  """`process` taking client ids: workers build each client's dataset.

  The dataset computation is the task's `serializable_dataset_fn` followed by
  its training preprocessing (and, for processes that do not run K steps
  themselves, `repeat().take(K)` as `program.client_datasets` does), so the
  data is identical to what the trainer would have sent. Workers need the
  data: file-based tasks read their files on the worker at the same path;
  in-memory tasks embed the arrays in the computation.

  Args:
    process: a `LearningProcess` whose `next` takes one federated dataset.
    task: a `tasks.base.FederatedTask`.
    local_steps: K, applied to the data unless the process runs K itself.

  Returns:
    (the composed `LearningProcess`, the K baked into the data or None).
  """
  client_dataset = _client_dataset_fn(task)
  if client_dataset is None:
    raise errors.ArgumentError('compose_data_on_workers', None,
                               f'task {task.name} {_NO_DATASET_FN}')
  data_steps = None if has_round_hparams(process) else (local_steps or None)

  @tff.tensorflow.computation(tf.string)
  def build_client_dataset(client_id):
    dataset = client_dataset(client_id)
    if data_steps is not None:
      dataset = dataset.repeat().take(data_steps)
    return dataset

  composed = tff.simulation.compose_dataset_computation_with_learning_process(
      build_client_dataset, process)
  return composed, data_steps


_NO_DATASET_FN = 'has no serializable dataset function (train_data.serializable_dataset_fn)'


def _refused(detail: str) -> errors.ArgumentError:
  return errors.ArgumentError('compose_cohort_data_on_workers', None, detail)


def _client_dataset_fn(task):
  """client id → the task's preprocessed training dataset, for graphs built for TFF
  (None: the task has no serializable dataset function)."""
  dataset_fn = getattr(task.train_data, 'serializable_dataset_fn', None)
  if dataset_fn is None:
    return None
  # Seeded shuffles built eagerly in the trainer mix in the global seed
  # (`tf.random.set_seed`); graphs built for TFF have their own, unset seed.
  # Carry the trainer's over so both build the same shuffles.
  global_seed = eager_context.global_seed()

  def client_dataset(client_id):
    if global_seed is not None:
      tf.random.set_seed(global_seed)
    return task.preprocess_train(dataset_fn(client_id), client_id)

  return client_dataset


def compose_cohort_data_on_workers(process: cohort.CohortProcess, task):
  """The cohort `process` on TFF workers, taking each shard's client ids.

  Per round, each worker gets one shard's ids (`SHARD_IDS_TYPE`) and K (the
  state's `local_steps`, broadcast), builds the shard with
  `cohort_data.shard_from_ids` from the dataset computation
  `compose_data_on_workers` uses, and runs the process's own shard program;
  the shards' weighted sums are summed once, as in `process.tff_next`.

  `task`: its `name`, `train_data.serializable_dataset_fn` (client id → raw
  dataset) and `preprocess_train(dataset, client_id)` (the id a string tensor,
  which seeds the client's shuffle in tasks/base.py's tasks).

  Returns a `LearningProcess` whose `next` takes a CLIENTS-placed list of
  shards' ids (`shard_ids_fn`).
  """
  if process.execution.in_process:
    raise _refused('the cohort process runs in process; build it with '
                   'CohortExecution(in_process=False) for TFF workers')
  client_dataset = _client_dataset_fn(task)
  if client_dataset is None:
    raise _refused(f'task {task.name} {_NO_DATASET_FN}')
  state_type, shards_type = process.tff_next.type_signature.parameter

  try:
    build_shard = _shard_computation(client_dataset)
  except ValueError as e:  # `shard_from_ids` refusing the task's batches
    raise _refused(f'task {task.name}: {str(e).removeprefix("shard_from_ids: ")} (the '
                   'per-client execution builds its datasets on the workers)') from e
  if not shards_type.member.is_assignable_from(build_shard.type_signature.result):
    raise _refused(f"task {task.name}'s batches {build_shard.type_signature.result} do not fit "
                   f"the model's {shards_type.member}")

  @tff.tensorflow.computation(state_type.member.client_work)
  def local_steps_of(hparams):
    return hparams['local_steps']

  @tff.federated_computation(state_type, tff.FederatedType(SHARD_IDS_TYPE, tff.CLIENTS))
  def next_fn(state, shard_ids):
    steps = tff.federated_broadcast(tff.federated_map(local_steps_of, state.client_work))
    return process.tff_next(state, tff.federated_map(build_shard, (shard_ids, steps)))

  return tff.learning.templates.LearningProcess(
      process.initialize, next_fn, process.get_model_weights, process.set_model_weights,
      get_hparams_fn=process.get_hparams, set_hparams_fn=process.set_hparams)


def _shard_computation(client_dataset):

  @tff.tensorflow.computation(SHARD_IDS_TYPE, np.int32)
  def build_shard(client_ids, local_steps):
    return cohort_data.shard_from_ids(client_ids, local_steps, client_dataset)

  return build_shard


def shard_ids_fn(num_shards: int):
  """`program.run`'s `client_data_fn` for `compose_cohort_data_on_workers`: the
  sampled ids in at most `num_shards` shards of near-equal counts (one per
  worker: the driver knows ids, not sizes)."""

  def shard_ids(client_ids: list[str], steps: Optional[int]) -> list[np.ndarray]:
    if steps is not None:  # the cohort process takes K from its state
      raise ValueError(f'data on workers takes K from the state, the loop asks for {steps}')
    parts = min(num_shards, len(client_ids))
    return [np.array(part, dtype=object) for part in np.array_split(list(client_ids), parts)]

  return shard_ids


def client_ids_fn(data_steps: Optional[int]):
  """`program.run`'s `client_data_fn` for a process from `compose_data_on_workers`."""

  def client_data(client_ids: list[str], steps: Optional[int]) -> list[str]:
    if steps != data_steps:
      raise ValueError(f'data on workers was built for {data_steps} local steps, the loop asks '
                       f'for {steps}')
    return list(client_ids)

  return client_data

