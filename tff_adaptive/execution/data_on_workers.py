"""Workers build the client datasets from client ids.

`compose_data_on_workers` composes a learning process with a computation that
builds each client's dataset from its id
(`tff.simulation.compose_dataset_computation_with_learning_process`), so a
round sends ids instead of data; `client_ids_fn` is the training loop's
`client_data_fn` for such a process.
"""

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.python.eager import context as eager_context

from tff_adaptive.algorithms import composer


def has_round_hparams(process) -> bool:
  """Whether `process` runs K local steps itself (`local_steps` in its state's client_work)."""
  return composer.runs_local_steps(process.initialize.type_signature.result)


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
  train_data = task.train_data
  dataset_fn = getattr(train_data, 'serializable_dataset_fn', None)
  if dataset_fn is None:
    raise ValueError(f'compose_data_on_workers: task {task.name} has no serializable dataset '
                     'function (train_data.serializable_dataset_fn)')
  data_steps = None if has_round_hparams(process) else (local_steps or None)
  # Seeded shuffles built eagerly in the trainer mix in the global seed
  # (`tf.random.set_seed`); graphs built for TFF have their own, unset seed.
  # Carry the trainer's over so both build the same shuffles.
  global_seed = eager_context.global_seed()

  @tff.tensorflow.computation(tf.string)
  def build_client_dataset(client_id):
    if global_seed is not None:
      tf.random.set_seed(global_seed)
    dataset = task.preprocess_train(dataset_fn(client_id))
    if data_steps is not None:
      dataset = dataset.repeat().take(data_steps)
    return dataset

  composed = tff.simulation.compose_dataset_computation_with_learning_process(
      build_client_dataset, process)
  return composed, data_steps


def client_ids_fn(data_steps: Optional[int]):
  """`program.run`'s `client_data_fn` for a process from `compose_data_on_workers`."""

  def client_data(client_ids: list[str], steps: Optional[int]) -> list[str]:
    if steps != data_steps:
      raise ValueError(f'data on workers was built for {data_steps} local steps, the loop asks '
                       f'for {steps}')
    return list(client_ids)

  return client_data

