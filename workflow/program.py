"""The simulation loop: sample, train a round, evaluate, release, checkpoint.

Program state (the learning process state, the round number and the running
totals) goes through `tff.program.FileProgramStateManager`; metrics go through
`tff.program.CSVFileReleaseManager` and `TensorBoardReleaseManager`. A rerun
into the same directory resumes from the latest saved state; the CSV manager
drops any rows released after that state, so a crash or Ctrl-C loses no more
than the rounds since the last checkpoint and never duplicates a round.
"""

import asyncio
import collections
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tqdm

from tasks import base as task_base
from tff_adaptive.algorithms import composer


class IncompatibleCheckpoint(ValueError):
  """A checkpoint whose state cannot be this process's state."""


async def _load_checkpoint(state_manager, output_dir: str, version: int, structure):
  """Loads checkpoint `version` into `structure`.

  Containers may differ (a list saved where the process now has a tuple, as
  MFL's state did before it kept s_0's containers): the values are then
  matched leaf by leaf, which needs the same number, order and shapes of
  leaves. Anything else is a checkpoint of another program version or
  configuration, reported in one line instead of TFF's structure dump.
  """
  from tensorflow_federated.python.program import file_utils  # pylint: disable=g-import-not-at-top
  try:
    return await state_manager.load(version, structure)
  except (ValueError, TypeError):
    pass
  path = os.path.join(output_dir, 'checkpoints', f'program_state_{version}')
  saved = tf.nest.flatten(await file_utils.read_saved_model(path))
  expected = tf.nest.flatten(structure)
  if len(saved) == len(expected) and all(
      np.shape(a) == np.shape(b) for a, b in zip(saved, expected)):
    return tf.nest.pack_sequence_as(structure, saved)
  raise IncompatibleCheckpoint(
      f'{path} (round {version}) does not hold this run\'s state ({len(saved)} saved values '
      f'for {len(expected)} expected): it was written by another version of tff_adaptive. '
      f'Use another --experiment_name or --root_output_dir, or delete {output_dir} to start '
      'over.')


class TrainingDiverged(RuntimeError):
  pass


@dataclasses.dataclass
class LoopConfig:
  total_rounds: int
  clients_per_round: int
  rounds_per_eval: int
  rounds_per_checkpoint: int
  output_dir: str
  seed: int = 0
  local_steps: Optional[int] = None  # None: the task's epochs
  schedules: Optional[Any] = None  # a round_schedules.RoundSchedules
  show_progress: bool = True
  # Per-client state kept across rounds (personalised FL, e.g. MTFL's private
  # patches): a `personalization.PersonalizationHook`. None: no client state.
  client_state: Optional[Any] = None


def sample_clients(client_ids: list[str], num: int, seed: int, round_num: int) -> list[str]:
  """Uniform without replacement within a round; a fresh draw per (seed, round)."""
  rng = np.random.default_rng([seed, round_num])
  chosen = rng.choice(len(client_ids), size=min(num, len(client_ids)), replace=False)
  return [client_ids[i] for i in sorted(chosen)]


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = '') -> dict[str, float]:
  flat = {}
  for key, value in metrics.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      flat.update(flatten_metrics(value, name + '/'))
    elif np.ndim(value) == 0:
      flat[name] = float(value)
  return flat


def client_datasets(task: task_base.FederatedTask, client_ids: list[str],
                    local_steps: Optional[int]) -> list[tf.data.Dataset]:
  """Preprocessed datasets; with `local_steps`, exactly K batches, cycling."""
  datasets = task.client_train_datasets(client_ids)
  if local_steps is not None:
    datasets = [ds.repeat().take(local_steps) for ds in datasets]
  return datasets


class KerasEvaluator:
  """Centralized test metrics of the global model, computed with Keras.

  Cheaper than a federated evaluation computation, and exact for the global
  model; per-client evaluation lives with the personalisation code.
  """

  def __init__(self, task: task_base.FederatedTask):
    # The task says how (loss, metrics, test data); classifiers get the
    # default sparse cross-entropy and accuracy.
    evaluation = task.keras_evaluation()
    self._model = task.keras_model_fn()
    self._model.compile(loss=evaluation.loss_fn(), metrics=evaluation.metrics_fn())
    self._data = evaluation.data_fn()
    if evaluation.cache:
      self._data = self._data.cache()

  def __call__(self, model_weights) -> dict[str, float]:
    model_weights.assign_weights_to(self._model)
    results = self._model.evaluate(self._data, verbose=0, return_dict=True)
    return {name: float(value) for name, value in results.items()}


def _all_finite(structure) -> bool:
  return all(np.all(np.isfinite(np.asarray(v))) for v in tf.nest.flatten(structure)
             if np.issubdtype(np.asarray(v).dtype, np.floating))


class _Releases:
  """CSV + TensorBoard metrics releases, keyed by round."""

  def __init__(self, output_dir: str):
    self._managers = [
        tff.program.CSVFileReleaseManager(os.path.join(output_dir, 'metrics.csv'),
                                          key_fieldname='round'),
        tff.program.TensorBoardReleaseManager(os.path.join(output_dir, 'tensorboard')),
    ]

  async def release(self, metrics: Mapping[str, float], round_num: int):
    await asyncio.gather(*[m.release(dict(metrics), key=round_num) for m in self._managers])


def run(process: tff.learning.templates.LearningProcess, task: task_base.FederatedTask,
        config: LoopConfig,
        round_metrics_fn: Optional[Callable[[int, Any], Mapping[str, float]]] = None,
        client_data_fn: Optional[Callable[[list[str], Optional[int]], Any]] = None):
  """Runs (or resumes) training; returns (final state, last metrics row).

  Args:
    process: any `tff.learning.templates.LearningProcess` taking a list of
      client datasets (or what `client_data_fn` returns).
    task: the task supplying client data and evaluation.
    config: loop configuration.
    round_metrics_fn: optional `(round_num, output) -> metrics` adding rows
      (for example analytic costs) to each round's released metrics.
    client_data_fn: optional `(sampled client ids, K or None) -> process
      input`; default: the preprocessed datasets (`client_datasets`). A
      process that builds datasets on the workers takes the ids themselves
      (`workers.compose_data_on_workers`).
  """
  return asyncio.run(_run(process, task, config, round_metrics_fn, client_data_fn))


async def _run(process, task, config, round_metrics_fn, client_data_fn=None):
  if client_data_fn is None:
    client_data_fn = lambda ids, steps: client_datasets(task, ids, steps)
  state_manager = tff.program.FileProgramStateManager(
      os.path.join(config.output_dir, 'checkpoints'), keep_total=3, keep_first=False)
  releases = _Releases(config.output_dir)
  evaluate = KerasEvaluator(task)

  initial = process.initialize()
  sched = config.schedules
  # Schedules' state is JSON text: feedback windows and plateau counters are
  # small Python structures that a SavedModel does not hold natively.
  # Running totals are JSON text too: their keys (the process's cost metrics)
  # are unknown before the checkpoint is read, and loading needs a structure.
  program_state = {'state': initial, 'totals': '{}',
                   'schedules': sched.to_json() if sched else ''}
  start_round = 0
  versions = await state_manager.get_versions()
  if versions:
    start_round = versions[-1]
    program_state = await _load_checkpoint(state_manager, config.output_dir, start_round,
                                           dict(program_state))
    program_state['state'] = tf.nest.pack_sequence_as(
        initial, tf.nest.flatten(program_state['state']))
    print(f'Resuming from the checkpoint after round {start_round}.', file=sys.stderr)
  hook = config.client_state
  if hook is not None:
    # The client-state snapshot saved with this server checkpoint (0: none).
    hook.restore(start_round)
  state = program_state['state']
  if sched is not None and program_state.get('schedules'):
    saved = program_state['schedules']
    sched.restore(saved.decode() if isinstance(saved, bytes) else str(saved))
  saved_totals = program_state['totals']
  if isinstance(saved_totals, (bytes, str)):
    saved_totals = json.loads(saved_totals.decode() if isinstance(saved_totals, bytes)
                              else saved_totals)
  totals = collections.defaultdict(float, {k: float(v) for k, v in saved_totals.items()})
  last_checkpoint = start_round

  client_ids = list(task.train_data.client_ids)
  bar = tqdm.tqdm(total=config.total_rounds, initial=start_round, unit='round',
                  disable=not config.show_progress, file=sys.stderr, dynamic_ncols=True)
  row = {}
  last_eval = {}
  try:
    for round_num in range(start_round + 1, config.total_rounds + 1):
      started = time.monotonic()
      sampled = sample_clients(client_ids, config.clients_per_round, config.seed, round_num)
      # Composer-built processes run K steps themselves (K is in their state).
      data_steps = None if _has_round_hparams(state) else config.local_steps
      schedule_row = {}
      if sched is not None:
        state, scheduled_steps, schedule_row = sched.apply(state, round_num)
        data_steps = scheduled_steps if scheduled_steps is not None else data_steps
      try:
        data = client_data_fn(sampled, data_steps)
        if hook is not None:  # pair each client's data with its own state
          data = hook.client_data(round_num, sampled, data)
        output = process.next(state, data)
      except Exception as e:
        # The caller (bin/train) reports where a rerun resumes; the type is kept.
        e.add_note(f'Round {round_num} failed; the last checkpoint is after round '
                   f'{last_checkpoint} in {config.output_dir}.')
        raise
      # Process measurements: costs keep their `cost/` names (and get running
      # totals below); everything else is a training metric.
      row = {(k if k.startswith('cost/') else f'train/{k}'): v
             for k, v in flatten_metrics(output.metrics).items()}
      if round_metrics_fn is not None:
        row.update(round_metrics_fn(round_num, output))
      train_loss = next((v for k, v in row.items() if k.endswith('train/loss')), 0.0)
      weights = process.get_model_weights(output.state)
      if not math.isfinite(train_loss) or not _all_finite(weights.trainable):
        raise TrainingDiverged(
            f'training diverged at round {round_num} (non-finite '
            f'{"training loss" if not math.isfinite(train_loss) else "model weights"}); '
            f'try a smaller --client_learning_rate or --server_learning_rate. The last good '
            f'checkpoint (round {last_checkpoint}) is kept in {config.output_dir}.')
      state = output.state
      is_eval_round = round_num % config.rounds_per_eval == 0 or round_num == config.total_rounds
      if hook is not None:  # store what the clients returned; user accuracy
        row.update(hook.after_round(round_num, sampled, output, is_eval_round))
      for key, value in list(row.items()):
        if key.startswith('cost/') and not key.endswith('state_floats'):
          totals[key] += value
      row.update({f'cost/cumulative_{k[len("cost/"):]}': v for k, v in totals.items()})
      row['round_seconds'] = time.monotonic() - started
      if round_num % config.rounds_per_eval == 0 or round_num == config.total_rounds:
        last_eval = {f'eval/{k}': v for k, v in evaluate(weights).items()}
        row.update(last_eval)
      if sched is not None:
        row.update(schedule_row)
        row.update(sched.observe(round_num, row, len(sampled)))
      await releases.release(row, round_num)
      if round_num % config.rounds_per_checkpoint == 0 or round_num == config.total_rounds:
        if hook is not None:  # first: a server checkpoint always has its client state
          hook.save(round_num)
        await state_manager.save({'state': state, 'totals': json.dumps(dict(totals)),
                                  'schedules': sched.to_json() if sched else ''}, round_num)
        last_checkpoint = round_num
      bar.update(1)
      bar.set_postfix(_progress_postfix(row, last_eval), refresh=False)
      if not sys.stderr.isatty() and config.show_progress and round_num % config.rounds_per_eval == 0:
        print(f'round {round_num}/{config.total_rounds} ' +
              ' '.join(f'{k}={v:.4g}' for k, v in _progress_postfix(row, last_eval).items()),
              file=sys.stderr, flush=True)
  finally:
    bar.close()
  return state, row


def _has_round_hparams(state) -> bool:
  return composer.runs_local_steps(state)


def _progress_postfix(row, last_eval):
  shown = {}
  for key, value in row.items():
    if key.endswith('train/loss') or key.endswith('train/sparse_categorical_accuracy'):
      shown['loss' if key.endswith('loss') else 'acc'] = value
  for key, value in last_eval.items():
    shown[key.replace('eval/', 'eval_')] = value
  return {k: round(v, 4) for k, v in shown.items()}
