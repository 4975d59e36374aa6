"""`FederatedTask`: a TFF `BaselineTask` plus what our tooling needs beside it."""

import dataclasses
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff


# The test clients' order when they are joined into one dataset: any fixed one,
# the same for every run, seed and process.
TEST_CLIENT_ORDER_SEED = 0


def centralized_test_data(datasets: tff.simulation.baselines.BaselineTaskDatasets
                          ) -> tf.data.Dataset:
  """`datasets.get_centralized_test_data()` with the test clients joined in one
  fixed order. TFF's joins them in an order drawn without a seed, another in
  every process: a strided evaluation (--eval_stride) then evaluates other
  examples after each start or resume, and two runs of one command differ in
  their evaluation by that alone."""
  test = datasets.test_data
  if isinstance(test, tff.simulation.datasets.ClientData):
    test = all_clients(test)
  preprocess = datasets.eval_preprocess_fn
  return test if preprocess is None else preprocess(test)


def all_clients(client_data: tff.simulation.datasets.ClientData) -> tf.data.Dataset:
  """Every client's examples, the clients in `TEST_CLIENT_ORDER_SEED`'s order."""
  return client_data.create_tf_dataset_from_all_clients(seed=TEST_CLIENT_ORDER_SEED)


@dataclasses.dataclass(frozen=True)
class KerasEvaluation:
  """How the global model is evaluated centrally with Keras.

  Attributes:
    loss_fn: builds the Keras loss, the same one the task trains with.
    metrics_fn: builds the Keras metrics; each is reported as
      `eval/<metric name>`.
    data_fn: builds the batched test dataset of `(x, y)` tuples.
    cache: whether the evaluator may cache `data_fn()` in memory; off where
      the preprocessed test set is large (dense bag-of-words vectors).
  """
  loss_fn: Callable[[], tf.keras.losses.Loss]
  metrics_fn: Callable[[], list[tf.keras.metrics.Metric]]
  data_fn: Callable[[], tf.data.Dataset]
  cache: bool = True


@dataclasses.dataclass(frozen=True)
class ClientShuffle:
  """Each client's examples shuffled before the task's preprocessing, with a seed
  made of the run's seed and the client's id, reshuffled at every pass (epoch).

  TFF's baselines shuffle inside their preprocessing without a seed: a fresh
  order at every visit, so two runs of one command differ (docs/performance.md)
  and a resumed run cannot equal an uninterrupted one.
  The tasks built on them ask TFF for no shuffle (`shuffle_buffer_size=1`)
  and shuffle here instead, with TFF's buffer, as the package's own tasks do:
  a client's order then depends on --seed and the client, and is the same at
  each of its visits in a run.
  """
  buffer: int
  seed: int

  def __call__(self, dataset: tf.data.Dataset, client_id) -> tf.data.Dataset:
    # FarmHash of the id: the same seed eagerly, in a traced function and on a worker.
    seed = (tf.strings.to_hash_bucket_fast(client_id, 2**31 - 1) +
            tf.constant(self.seed % 2**31, tf.int64) * 2**31)
    return dataset.shuffle(self.buffer, seed=seed, reshuffle_each_iteration=True)


@dataclasses.dataclass
class FederatedTask:
  """A task as TFF defines it, with the Keras model exposed.

  Attributes:
    name: registry name (`--task`).
    baseline: the `tff.simulation.baselines.BaselineTask` (datasets with their
      preprocessing, and the TFF `model_fn`); it plugs in exactly where TFF's
      own tasks do.
    keras_model_fn: builds the (uncompiled) Keras model behind `model_fn`, for
      FLOP counting and fast centralized evaluation.
    num_classes: output classes (for metrics).
    test_client_data: per-client test split matched to the training split
      (same labels/shards), for per-client (user) accuracy; None if the task
      has no such split.
    evaluation: how to evaluate the global model centrally; None means the
      default for classifiers on `{'x', 'y'}` batches of logits
      (`keras_evaluation()`). Tasks that differ (autoencoders, multi-label
      tags with Recall@5, next-word prediction with masked special tokens,
      softmax outputs) set their own.
    client_shuffle: the seeded shuffle of each client's examples before
      `baseline`'s preprocessing, for tasks whose TFF preprocessing would
      shuffle without a seed (`ClientShuffle`); None: the preprocessing's own.
  """
  name: str
  baseline: tff.simulation.baselines.BaselineTask
  keras_model_fn: Callable[[], tf.keras.Model]
  num_classes: int
  test_client_data: Optional[tff.simulation.datasets.ClientData] = None
  evaluation: Optional[KerasEvaluation] = None
  # Build client datasets with one traced function (`client_train_datasets`);
  # for tasks whose `train_data.serializable_dataset_fn` reads a file by id.
  trace_client_datasets: bool = False
  client_shuffle: Optional[ClientShuffle] = None
  _dataset_fn: Optional[Callable[[tf.Tensor], tf.data.Dataset]] = dataclasses.field(
      default=None, init=False, repr=False, compare=False)
  _client_id_set: Optional[frozenset] = dataclasses.field(
      default=None, init=False, repr=False, compare=False)

  @property
  def model_fn(self):
    return self.baseline.model_fn

  @property
  def train_data(self) -> tff.simulation.datasets.ClientData:
    return self.baseline.datasets.train_data

  def preprocess_train(self, dataset: tf.data.Dataset, client_id='') -> tf.data.Dataset:
    """Client `client_id`'s training dataset from its raw examples (its id seeds
    `client_shuffle`; without one, every client is shuffled alike)."""
    if self.client_shuffle is not None:
      dataset = self.client_shuffle(dataset, client_id)
    return self.baseline.datasets.train_preprocess_fn(dataset)

  def client_train_datasets(self, client_ids) -> list[tf.data.Dataset]:
    """`preprocess_train(train_data.create_tf_dataset_for_client(cid))` per id.

    With `trace_client_datasets`, the pipeline (TFF's proto parsing and the
    task's preprocessing, whose map functions tf.data traces again at every
    construction: 0.1 s per EMNIST client, 0.7 s per Stack Overflow tag
    client, docs/performance.md) is traced once per task into a `tf.function`
    of the client id and then only called (~5 ms per client).
    The datasets are the same graphs, their shuffles seeded per client
    (`ClientShuffle`). With a global seed set (`tf.random.set_seed`), an
    unseeded shuffle built eagerly takes a per-op seed that a traced function
    would repeat for every client, so the eager path is kept.
    """
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
    if not self.trace_client_datasets or context.global_seed() is not None:
      return [self.preprocess_train(self.train_data.create_tf_dataset_for_client(cid), cid)
              for cid in client_ids]
    if self._dataset_fn is None:
      dataset_fn = self.train_data.serializable_dataset_fn
      self._dataset_fn = tf.function(
          lambda cid: self.preprocess_train(dataset_fn(cid), cid),
          input_signature=[tf.TensorSpec((), tf.string)], autograph=False)
      self._client_id_set = frozenset(self.train_data.client_ids)
    for cid in client_ids:
      if cid not in self._client_id_set:  # as create_tf_dataset_for_client
        raise ValueError(f'ID [{cid}] is not a client in this ClientData. See property '
                         '`client_ids` for the list of valid ids.')
    return [self._dataset_fn(tf.constant(cid)) for cid in client_ids]

  def centralized_test_data(self) -> tf.data.Dataset:
    """Batched, preprocessed test data of all clients."""
    return centralized_test_data(self.baseline.datasets)

  def keras_evaluation(self) -> KerasEvaluation:
    """The task's `evaluation`, or the default for `{'x', 'y'}` classifiers."""
    if self.evaluation is not None:
      return self.evaluation
    return KerasEvaluation(
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
        data_fn=lambda: self.centralized_test_data().map(lambda b: (b['x'], b['y'])))
