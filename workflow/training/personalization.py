"""The training loop's side of per-client state: personalised FL, SCAFFOLD; UA, noise.

Thesis ch. 4 and docs/algorithms.md#mtfl. `PersonalizationHook` is what
`program.run` calls when `LoopConfig.client_state` is set:

  before a round   `client_data`: pairs each sampled client's training
                   data with its own test split and its stored private
                   state (`client_state.ClientStateStore`) — the per-client
                   input of a `stateful.PersonalizedClientsProcess`
                   (MTFL, Per-FedAvg, pFedMe; as a cohort, the shards gain
                   the clients' test batches);
  after a round    `after_round`: stores the private state each client
                   returned, and reports user accuracy (UA) of the sampled
                   clients, measured by them before local training
                   (`ua/mean`, `ua/std`, `ua/min`, `ua/max`); on evaluation
                   rounds also UA of every client with the new global model
                   and its stored patch (`ua_all/*`);
  checkpoints      `save(r)` / `restore(r)`: the store's snapshot of round r,
                   taken with the server checkpoint of round r.

Noisy clients (thesis Table 4.3): `add_input_noise` adds fixed zero-mean
Gaussian noise to the training inputs of a seeded fraction of the clients;
their UA is left out of every mean. `rounds_to_target` reads rounds to a
target mean UA off a metrics CSV (thesis Tables 4.2, 4.3).

`ClientStateHook` is the same without user accuracy, for a process whose
clients keep state (`rounds.stateful.StatefulClientsProcess`, SCAFFOLD's
control variates c_i): it pairs each sampled client's dataset with its stored
state and stores what the client returns, snapshotted with the checkpoints.
"""

import collections
import csv
import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base as task_base
from tff_adaptive.personalization import client_state
from workflow.flags import algorithms
from workflow.flags import config
from workflow.training import program
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data
from tff_adaptive.rounds import stateful

# From the registry's entries (`AlgorithmEntry.personalized`, `.keeps_client_state`).
PERSONALIZED_ALGORITHMS = algorithms.having('personalized')
# Algorithms whose clients keep state between rounds (a store, --client_state_dir).
CLIENT_STATE_ALGORITHMS = algorithms.having('keeps_client_state')


def noisy_client_ids(client_ids: Sequence[str], fraction: float, seed: int) -> list[str]:
  """A seeded `fraction` of the clients (rounded to the nearest count)."""
  if not 0.0 <= fraction < 1.0:
    raise ValueError(f'--noisy_client_fraction must be in [0, 1); got {fraction}')
  count = int(round(fraction * len(client_ids)))
  rng = np.random.default_rng([seed, 7])  # 7: a stream apart from sampling's
  chosen = rng.choice(len(client_ids), size=count, replace=False)
  return sorted(client_ids[i] for i in chosen)


def add_input_noise(task: task_base.FederatedTask, noisy_ids: Iterable[str], stddev: float,
                    seed: int = 0) -> task_base.FederatedTask:
  """`task` whose noisy clients' training inputs `x` carry fixed N(0, stddev²) noise.

  Fixed: example j of client c always gets the same noise (stateless draws
  keyed by (seed, c, j)), as if the noise had been added to the stored data
  once (the thesis's setup). Test data and the centralized evaluation are
  untouched.
  """
  noisy_ids = sorted(noisy_ids)
  if not noisy_ids:
    return task
  if not stddev > 0:
    raise ValueError(f'--noise_stddev must be positive; got {stddev}')
  base_data = task.train_data
  if not isinstance(base_data.element_type_structure, Mapping) or \
      'x' not in base_data.element_type_structure:
    raise ValueError(f'--noisy_client_fraction needs examples with an input `x`; task '
                     f'{task.name} has {base_data.element_type_structure}')
  unknown = set(noisy_ids) - set(base_data.client_ids)
  if unknown:
    raise ValueError(f'noisy clients {sorted(unknown)[:3]} are not clients of {task.name}')
  base_fn = base_data.serializable_dataset_fn

  def dataset_fn(client_id):
    is_noisy = tf.reduce_any(tf.equal(tf.constant(noisy_ids), client_id))
    key = tf.strings.to_hash_bucket_fast(client_id, 2**31 - 1) + seed

    def add(index, example):
      example = collections.OrderedDict(example)
      x = example['x']
      noise = tf.random.stateless_normal(tf.shape(x), seed=tf.stack([key, index]), dtype=x.dtype)
      example['x'] = x + tf.where(is_noisy, tf.constant(stddev, x.dtype), tf.zeros([], x.dtype)) * noise
      return example

    return base_fn(client_id).enumerate().map(add)

  train_data = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      base_data.client_ids, dataset_fn)
  old = task.baseline.datasets
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train_data, test_data=old.test_data, validation_data=old.validation_data,
      train_preprocess_fn=old.train_preprocess_fn, eval_preprocess_fn=old.eval_preprocess_fn)
  return dataclasses.replace(
      task, baseline=tff.simulation.baselines.BaselineTask(datasets, task.baseline.model_fn))


def summarize(accuracies: Sequence[float], prefix: str) -> dict[str, float]:
  values = np.asarray(accuracies, np.float64)
  if values.size == 0:
    return {}
  return {f'{prefix}/mean': float(values.mean()), f'{prefix}/std': float(values.std()),
          f'{prefix}/min': float(values.min()), f'{prefix}/max': float(values.max()),
          f'{prefix}/num_clients': float(values.size)}


class ClientStateHook:
  """Per-client state for `program.run` (`LoopConfig.client_state`), without UA.

  Args:
    process: a `stateful.StatefulClientsProcess`.
    store: where the clients' states live between rounds.
  """

  def __init__(self, process: stateful.StatefulClientsProcess,
               store: Optional[client_state.ClientStateStore]):
    self._process = process
    self._store = store

  @property
  def store(self) -> Optional[client_state.ClientStateStore]:
    return self._store

  def client_data(self, round_num: int, client_ids: Sequence[str], data):
    """Each client's data (its dataset, or the cohort's padded shards) with its stored state."""
    del round_num
    states = [self._store.get(client_id) for client_id in client_ids]
    if cohort.is_cohort(self._process):
      return self._process.with_client_states(data, states)
    return [self._process.client_input(dataset, state) for dataset, state in zip(data, states)]

  def _put(self, client_ids: Sequence[str], states: Sequence[Any]) -> None:
    if len(states) != len(client_ids):
      raise RuntimeError(f'{len(states)} client outputs for {len(client_ids)} clients')
    if self._store is not None:
      for client_id, value in zip(client_ids, states):
        self._store.put(client_id, value)

  def after_round(self, round_num: int, client_ids: Sequence[str], output: Any,
                  evaluate: bool) -> dict[str, float]:
    """Stores the returned states; no metrics of its own."""
    del round_num, evaluate
    self._put(client_ids, list(output.clients))
    return {}

  def save(self, round_num: int) -> None:
    if self._store is not None:
      self._store.save(round_num)

  def restore(self, round_num: int) -> None:
    if self._store is not None:
      self._store.restore(round_num)


class PersonalizationHook(ClientStateHook):
  """Per-client state and UA for `program.run` (`LoopConfig.client_state`).

  Args:
    process: the personalised process (`is_personalized`: its per-client
      input and output).
    task: a task with `test_client_data` (matched per-client test splits).
    store: the private-state store; required iff the process has private
      state.
    noisy_clients: clients left out of UA means.
    evaluate_all_clients: on evaluation rounds, also measure UA of every
      client (`ua_all/*`).
  """

  def __init__(self, process, task: task_base.FederatedTask, *,
               store: Optional[client_state.ClientStateStore] = None,
               noisy_clients: Iterable[str] = (), evaluate_all_clients: bool = True):
    if task.test_client_data is None:
      raise ValueError(f'task {task.name} has no per-client test split, which user accuracy '
                       'needs (digits, mnist, cifar10 have one; e.g. --partition=shards)')
    if process.has_private_state and store is None:
      raise ValueError(f'{process.name} keeps private client state: it needs a store')
    super().__init__(process, store if process.has_private_state else None)
    self._task = task
    self._noisy = frozenset(noisy_clients)
    self._evaluate_all = evaluate_all_clients

  def test_dataset(self, client_id: str) -> tf.data.Dataset:
    data = self._task.test_client_data.create_tf_dataset_for_client(client_id)
    return self._task.baseline.datasets.eval_preprocess_fn(data)

  def client_data(self, round_num: int, client_ids: Sequence[str], data):
    """Each client's training data (datasets, or the cohort's padded shards) with its
    test split and its stored private state."""
    del round_num
    if not cohort.is_cohort(self._process):
      return self._client_inputs(client_ids, data)
    tests = [cohort_data.client_batches(self.test_dataset(c), 0) for c in client_ids]
    states = ([self._store.get(c) for c in client_ids] if self._store is not None else None)
    return self._process.with_test_batches(data, tests, states)

  def _client_inputs(self, client_ids: Sequence[str],
                     datasets: Sequence[tf.data.Dataset]) -> list[collections.OrderedDict]:
    """The per-client inputs of `next` and `evaluate_clients`."""
    out = []
    for client_id, dataset in zip(client_ids, datasets):
      test = self.test_dataset(client_id)
      state = self._store.get(client_id) if self._store is not None else None
      out.append(self._process.client_input(dataset, state, test=test))
    return out

  def _accuracies(self, client_ids, outputs):
    accuracies = []
    for client_id, out in zip(client_ids, outputs):
      examples = int(out['ua']['examples'])
      if client_id in self._noisy or examples == 0:
        continue
      accuracies.append(float(out['ua']['correct']) / examples)
    return accuracies

  def after_round(self, round_num: int, client_ids: Sequence[str], output: Any,
                  evaluate: bool) -> dict[str, float]:
    """Stores the returned private state; returns the round's UA metrics."""
    del round_num
    outputs = list(output.clients)
    self._put(client_ids, [out.get('private') for out in outputs])
    row = summarize(self._accuracies(client_ids, outputs), 'ua')
    if evaluate and self._evaluate_all:
      row.update(self.evaluate_all(output.state))
    return row

  def evaluate_all(self, state) -> dict[str, float]:
    """UA of every (clean) client: the global model plus its stored patch."""
    ids = list(self._task.train_data.client_ids)
    datasets = program.client_datasets(self._task, ids, None)
    outputs = self._process.evaluate_clients(state, self._client_inputs(ids, datasets))
    return summarize(self._accuracies(ids, outputs), 'ua_all')


# ---- flags → hook (bin/train) ----


def is_personalized(process) -> bool:
  """A round whose clients measure user accuracy (`Recipe.user_accuracy`)."""
  return isinstance(process, stateful.PersonalizedClientsProcess)


def experiment_fingerprint(settings: config.Settings, ignored: Iterable[str]) -> str:
  """A hash of the flags that define the computation (resumable ones left out)."""
  ignored = set(ignored) | {'client_state_dir', 'experiment_name'}
  # The flat {flag: value} is the data here: the hash is kept in the store's
  # directory and must equal the one of runs that hashed bin/train's flag dict.
  flags = settings.flag_values()
  defining = {k: v for k, v in sorted(flags.items()) if k not in ignored}
  return hashlib.sha256(json.dumps(defining, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _store(settings, task, process, output_dir, ignored_flags) -> client_state.ClientStateStore:
  directory = settings.personalized.client_state_dir or os.path.join(output_dir, 'client_state')
  fingerprint = dict(process.fingerprint)
  fingerprint['task'] = task.name
  fingerprint['experiment'] = experiment_fingerprint(settings, ignored_flags)
  initial = (process.private_initial if is_personalized(process)
             else process.client_state_initial)
  try:
    return client_state.ClientStateStore(directory, initial, fingerprint)
  except client_state.ClientStateError as e:
    # The directory is the flag's or one below the experiment's: either flag chooses another.
    raise client_state.ClientStateError(
        e.problem, 'use a new --experiment_name, --root_output_dir or --client_state_dir') from None


def setup(settings: config.Settings, task: task_base.FederatedTask, process, output_dir: str,
          ignored_flags: Iterable[str] = ()) -> tuple[task_base.FederatedTask,
                                                       Optional[ClientStateHook]]:
  """(task with noisy clients, hook) for a process with per-client state; (task, None) else."""
  if isinstance(process, stateful.StatefulClientsProcess) and not is_personalized(process):
    return task, ClientStateHook(process, _store(settings, task, process, output_dir,
                                                 ignored_flags))
  if not is_personalized(process):
    return task, None
  noisy = []
  fraction = settings.personalized.noisy_client_fraction or 0.0
  if fraction:
    seed = settings.loop.seed
    noisy = noisy_client_ids(list(task.train_data.client_ids), fraction, seed)
    task = add_input_noise(task, noisy, settings.personalized.noise_stddev, seed)
  store = None
  if process.has_private_state:
    store = _store(settings, task, process, output_dir, ignored_flags)
  return task, PersonalizationHook(process, task, store=store, noisy_clients=noisy)


# ---- reading results ----


def read_metrics(path: str) -> list[dict[str, float]]:
  with open(path) as f:
    return [{k: float(v) for k, v in row.items() if v not in ('', None)}
            for row in csv.DictReader(f)]


def rounds_to_target(rows: Sequence[Mapping[str, float]], target: float,
                     column: str = 'ua/mean') -> Optional[int]:
  """The first round whose `column` reaches `target` (None: never)."""
  for row in rows:
    value = row.get(column)
    if value is not None and not math.isnan(value) and value >= target:
      return int(row['round'])
  return None
