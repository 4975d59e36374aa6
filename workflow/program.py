"""The simulation loop: sample, train a round, evaluate, release, checkpoint.

Program state (the learning process state, the round number and the running
totals) goes through `tff.program.FileProgramStateManager`; metrics go through
`tff.program.CSVFileReleaseManager` and `TensorBoardReleaseManager`. A rerun
into the same directory resumes from the latest saved state that loads
(workflow/run_files.py's `recover`: damaged checkpoints are set aside, partial
ones removed); rows of
metrics.csv and TensorBoard events of rounds after that state are dropped, so a
crash, Ctrl-C or full disk loses no more than the rounds since the last intact
checkpoint and never duplicates a round. docs/reliability.md lists what is
guaranteed, each failure's message and how to recover by hand.
"""

import asyncio
import collections
import contextlib
import dataclasses
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tqdm

from tasks import base as task_base
from tff_adaptive.algorithms import composer
from tff_adaptive.rounds import cohort
from workflow import cohort_feed
from workflow import data_checks
from workflow import run_files


class TrainingDiverged(RuntimeError):
  pass


class WriteFailed(RuntimeError):
  """Writing a round's metrics or checkpoint failed (disk full, permissions...)."""


class Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM (bin/train's handlers raise it; `signum` says which)."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


@dataclasses.dataclass
class Progress:
  """Where a run is, for messages written after it stops."""
  round_num: int = 0  # the round being trained (0: none yet)
  last_checkpoint: int = 0  # the newest checkpoint written or resumed from (0: none)


# A run's files (workflow/run_files.py), re-exported: tests and tools use them as program's.
IncompatibleCheckpoint = run_files.IncompatibleCheckpoint
NoIntactCheckpoint = run_files.NoIntactCheckpoint
_load_checkpoint = run_files._load_checkpoint  # pylint: disable=protected-access
newest_checkpoint = run_files.newest_checkpoint
checkpoint_phrase = run_files.checkpoint_phrase
remove_partial_checkpoints = run_files.remove_partial_checkpoints
recover = run_files.recover
MetricsFile = run_files.MetricsFile
trim_tensorboard = run_files.trim_tensorboard
warn = run_files.warn
_first_line = run_files._first_line  # pylint: disable=protected-access


@dataclasses.dataclass
class LoopConfig:
  total_rounds: int
  clients_per_round: int
  rounds_per_eval: int
  rounds_per_checkpoint: int
  output_dir: str
  eval_stride: int = 1  # evaluate on every eval_stride-th test example
  first_eval_round: int = 0  # no evaluation before this round (but the last)
  seed: int = 0
  local_steps: Optional[int] = None  # None: the task's epochs
  schedules: Optional[Any] = None  # a round_schedules.RoundSchedules
  show_progress: bool = True
  # Per-client state kept across rounds (personalised FL, e.g. MTFL's private
  # patches): a `personalization.PersonalizationHook`. None: no client state.
  client_state: Optional[Any] = None
  # Finite blow-up rule: stop when the training loss exceeds
  # `divergence_factor` x the initial model's loss for `divergence_rounds`
  # consecutive rounds (0: only non-finite values stop a run).
  divergence_factor: float = 10.0
  divergence_rounds: int = 3
  # A round still running after this many seconds says so, then every 6x as
  # long (with show_progress; 0: never): a long round shows it is alive.
  heartbeat_seconds: float = 10.0
  # Filled in as the run goes (for messages after an interruption).
  progress: Progress = dataclasses.field(default_factory=Progress)

  def is_eval_round(self, round_num: int) -> bool:
    if round_num == self.total_rounds:
      return True
    return round_num >= self.first_eval_round and round_num % self.rounds_per_eval == 0


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


EVAL_BATCH_SIZE = 512


class KerasEvaluator:
  """Centralized test metrics of the global model, computed with Keras.

  Cheaper than a federated evaluation computation, and exact for the global
  model; per-client evaluation lives with the personalisation code.
  """

  def __init__(self, task: task_base.FederatedTask, stride: int = 1):
    # The task says how (loss, metrics, test data); classifiers get the
    # default sparse cross-entropy and accuracy.
    evaluation = task.keras_evaluation()
    self._model = task.keras_model_fn()
    self._model.compile(loss=evaluation.loss_fn(), metrics=evaluation.metrics_fn())
    self._data = evaluation.data_fn()
    if stride > 1:
      # Every stride-th example in the test set's order, not its first ones:
      # a test set stored client by client (LEAF Shakespeare: 779k sequences)
      # is then sampled across all clients, the same examples at every
      # evaluation. Keras weighs batches by their size, so the rebatching
      # changes no metric.
      self._data = self._data.unbatch().shard(stride, 0).batch(EVAL_BATCH_SIZE)
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
  """metrics.csv + TensorBoard releases, keyed by round, consistent with the checkpoint."""

  def __init__(self, output_dir: str, start_round: int):
    self.csv = MetricsFile(os.path.join(output_dir, 'metrics.csv'))
    self.csv.open_at(start_round)
    tensorboard_dir = os.path.join(output_dir, 'tensorboard')
    trim_tensorboard(tensorboard_dir, start_round)
    self._tensorboard = tff.program.TensorBoardReleaseManager(tensorboard_dir)

  async def release(self, metrics: Mapping[str, float], round_num: int):
    self.csv.release(metrics, round_num)
    await self._tensorboard.release(dict(metrics), key=round_num)


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
      (`data_on_workers.compose_data_on_workers`).
  """
  return asyncio.run(_run(process, task, config, round_metrics_fn, client_data_fn))


async def _run(process, task, config, round_metrics_fn, client_data_fn=None):
  feeder = None
  if client_data_fn is None and cohort.is_cohort(process):
    feeder = cohort_feed.CohortFeeder(task, process)
  elif client_data_fn is None:
    client_data_fn = lambda ids, steps: client_datasets(task, ids, steps)
  try:
    return await _rounds(process, task, config, round_metrics_fn, client_data_fn, feeder)
  finally:
    if feeder is not None:
      feeder.close()


def _model_weights(process, state):
  # In-process cohort rounds keep the state in this process: no executor call.
  if cohort.is_cohort(process) and process.execution.in_process:
    return state.global_model_weights
  return process.get_model_weights(state)


async def _rounds(process, task, config, round_metrics_fn, client_data_fn, feeder):
  progress = config.progress
  state_manager = tff.program.FileProgramStateManager(
      os.path.join(config.output_dir, 'checkpoints'), keep_total=3, keep_first=False)
  evaluate = KerasEvaluator(task, config.eval_stride)

  initial = process.initialize()
  sched = config.schedules
  # Schedules' state is JSON text: feedback windows and plateau counters are
  # small Python structures that a SavedModel does not hold natively.
  # Running totals are JSON text too: their keys (the process's cost metrics)
  # are unknown before the checkpoint is read, and loading needs a structure.
  program_state = {'state': initial, 'totals': '{}',
                   'schedules': sched.to_json() if sched else ''}
  start_round, loaded = await recover(state_manager, config.output_dir, dict(program_state))
  if loaded is not None:
    program_state = loaded
    program_state['state'] = tf.nest.pack_sequence_as(
        initial, tf.nest.flatten(program_state['state']))
    print(f'Resuming from the checkpoint after round {start_round}.', file=sys.stderr)
  # metrics.csv and TensorBoard drop what rounds after the checkpoint wrote.
  try:
    releases = _Releases(config.output_dir, start_round)
  except (OSError, tf.errors.OpError) as e:
    raise WriteFailed(f'cannot write the metrics in {config.output_dir} ({_first_line(e)}); '
                      f'{checkpoint_phrase(config.output_dir)}') from None
  hook = config.client_state
  if hook is not None:
    # The client-state snapshot saved with this server checkpoint (0: none).
    hook.restore(start_round)
  state = program_state['state']
  if loaded is not None:
    state = with_hparams_of(process, state, initial)
  if sched is not None and program_state.get('schedules'):
    saved = program_state['schedules']
    sched.restore(saved.decode() if isinstance(saved, bytes) else str(saved))
  saved_totals = program_state['totals']
  if isinstance(saved_totals, (bytes, str)):
    saved_totals = json.loads(saved_totals.decode() if isinstance(saved_totals, bytes)
                              else saved_totals)
  totals = collections.defaultdict(float, {k: float(v) for k, v in saved_totals.items()})
  progress.last_checkpoint = start_round
  # The finite blow-up rule's reference: the initial model's loss.
  blowup_limit, streak = math.inf, 0
  if config.divergence_factor > 0 and start_round < config.total_rounds:
    initial_loss = evaluate(process.get_model_weights(initial)).get('loss')
    if initial_loss is not None and math.isfinite(initial_loss) and initial_loss > 0:
      blowup_limit = config.divergence_factor * initial_loss

  def where_to_resume():
    return checkpoint_phrase(config.output_dir)

  client_ids = list(task.train_data.client_ids)
  if getattr(process, 'execution_line', None) and config.show_progress:
    print(process.execution_line, file=sys.stderr)
  bar = tqdm.tqdm(total=config.total_rounds, initial=start_round, unit='round',
                  disable=not config.show_progress, file=sys.stderr, dynamic_ncols=True)
  row = {}
  last_eval = {}
  non_finite_eval = False  # said once
  try:
    for round_num in range(start_round + 1, config.total_rounds + 1):
      progress.round_num = round_num
      started = time.monotonic()
      sampled = sample_clients(client_ids, config.clients_per_round, config.seed, round_num)
      # Composer-built processes run K steps themselves (K is in their state).
      data_steps = None if _has_round_hparams(state) else config.local_steps
      schedule_row = {}
      if sched is not None:
        state, scheduled_steps, schedule_row = sched.apply(state, round_num)
        data_steps = scheduled_steps if scheduled_steps is not None else data_steps
      try:
        if feeder is not None:  # K is this round's (schedules may change it)
          upcoming = sample_clients(client_ids, config.clients_per_round, config.seed,
                                    round_num + 1) if round_num < config.total_rounds else None
          data = feeder(sampled, int(state.client_work['local_steps']), upcoming)
        else:
          data = client_data_fn(sampled, data_steps)
        if hook is not None:  # pair each client's data with its own state
          data = hook.client_data(round_num, sampled, data)
        with _heartbeat(round_num, config):
          output = process.next(state, data)
      except Exception as e:
        # The caller (bin/train) reports where a rerun resumes; the type is kept.
        e.add_note(f'Round {round_num} failed; {where_to_resume()}.')
        raise
      # Process measurements: costs keep their `cost/` names (and get running
      # totals below); everything else is a training metric.
      row = {(k if k.startswith('cost/') else f'train/{k}'): v
             for k, v in flatten_metrics(output.metrics).items()}
      if round_metrics_fn is not None:
        row.update(round_metrics_fn(round_num, output))
      loss_key = next((k for k in row if k.endswith('train/loss')), None)
      train_loss = row[loss_key] if loss_key else 0.0
      weights = _model_weights(process, output.state)
      if feeder is not None:
        row['cohort_padding_waste'] = feeder.padding_waste
      if not math.isfinite(train_loss) or not _all_finite(weights.trainable):
        what = f'{loss_key}={train_loss}' if not math.isfinite(train_loss) else 'model weights'
        cause = data_checks.data_problem(task, sampled)  # NaN/inf data: named first
        raise TrainingDiverged(
            f'training diverged at round {round_num} (non-finite {what}); {cause}try a smaller '
            f'--client_learning_rate or --server_learning_rate; {where_to_resume()}.')
      streak = streak + 1 if train_loss > blowup_limit else 0
      if streak >= config.divergence_rounds:
        raise TrainingDiverged(
            f'training diverged at round {round_num} ({loss_key}={train_loss:.4g} above '
            f'{config.divergence_factor:g} x the initial model\'s loss for {streak} rounds; '
            f'--divergence_factor=0 turns this off); try a smaller --client_learning_rate or '
            f'--server_learning_rate; {where_to_resume()}.')
      state = output.state
      is_eval_round = config.is_eval_round(round_num)
      if hook is not None:  # store what the clients returned; user accuracy
        row.update(hook.after_round(round_num, sampled, output, is_eval_round))
      for key, value in list(row.items()):
        if key.startswith('cost/') and not key.endswith('state_floats'):
          totals[key] += value
      row.update({f'cost/cumulative_{k[len("cost/"):]}': v for k, v in totals.items()})
      row['round_seconds'] = time.monotonic() - started
      if is_eval_round:
        last_eval = {f'eval/{k}': v for k, v in evaluate(weights).items()}
        row.update(last_eval)
        non_finite_eval = _warn_non_finite_eval(last_eval, round_num, non_finite_eval)
      if sched is not None:
        row.update(schedule_row)
        row.update(sched.observe(round_num, row, len(sampled)))
      try:
        await releases.release(row, round_num)
      except (OSError, tf.errors.OpError) as e:
        raise WriteFailed(f'could not write the metrics of round {round_num} '
                          f'({_first_line(e)}); {where_to_resume()}; free space and rerun the '
                          'same command to resume') from None
      # No checkpoint while the loss is blowing up: the one kept is from before.
      checkpoint_due = (round_num % config.rounds_per_checkpoint == 0
                        or round_num == config.total_rounds)
      if checkpoint_due and (streak == 0 or round_num == config.total_rounds):
        try:
          if hook is not None:  # first: a server checkpoint always has its client state
            hook.save(round_num)
          await state_manager.save({'state': state, 'totals': json.dumps(dict(totals)),
                                    'schedules': sched.to_json() if sched else ''}, round_num)
        except (OSError, tf.errors.OpError) as e:
          remove_partial_checkpoints(os.path.join(config.output_dir, 'checkpoints'))
          raise WriteFailed(f'could not write the checkpoint of round {round_num} '
                            f'({_first_line(e)}); partial files removed; {where_to_resume()}; '
                            'free space and rerun the same command to resume') from None
        progress.last_checkpoint = round_num
      bar.update(1)
      bar.set_postfix(_progress_postfix(row, last_eval), refresh=False)
      if not sys.stderr.isatty() and config.show_progress and round_num % config.rounds_per_eval == 0:
        print(f'round {round_num}/{config.total_rounds} ' +
              ' '.join(f'{k}={v:.4g}' for k, v in _progress_postfix(row, last_eval).items()),
              file=sys.stderr, flush=True)
  finally:
    bar.close()
  return state, row


@contextlib.contextmanager
def _heartbeat(round_num: int, config: LoopConfig):
  """While the block runs: a line after `heartbeat_seconds`, then every 6x as long."""
  if not (config.show_progress and config.heartbeat_seconds > 0):
    yield
    return
  done = threading.Event()
  started = time.monotonic()

  def beat():
    wait = config.heartbeat_seconds
    while not done.wait(wait):
      tqdm.tqdm.write(f'round {round_num}/{config.total_rounds}: still running after '
                      f'{time.monotonic() - started:.0f} s', file=sys.stderr)
      sys.stderr.flush()
      wait = 6 * config.heartbeat_seconds

  thread = threading.Thread(target=beat, name='round-heartbeat', daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()


def with_hparams_of(process, state, initial):
  """`state` (a checkpoint's) with the hyperparameters of `initial` (this command's).

  A run resumes with the hyperparameters its flags give (recorded in
  flags.json), not with those its checkpoint happens to hold: they differ only
  when --trust_command_line replaced a lost flags.json with a command that
  changes one (without this, such a run recorded 1e12 and trained with 0.1). Schedules
  set theirs again each round (`RoundSchedules.apply`), so for an unchanged
  command this changes nothing.
  """
  return process.set_hparams(state, process.get_hparams(initial))


def _warn_non_finite_eval(metrics: Mapping[str, float], round_num: int, warned: bool) -> bool:
  """Warns (once per run) of non-finite evaluation metrics; returns whether it has warned.

  The run goes on: the model's weights and training loss are finite (checked
  before), so a NaN here comes from the task's evaluation data or metric, which
  stopping the run would not fix. The values are kept in metrics.csv as they are.
  """
  bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
  if bad and not warned:
    warn(f'round {round_num}: evaluation metrics {", ".join(f"{k}={metrics[k]}" for k in bad)} '
         'are not finite while the model\'s weights are: the task\'s test data or metric '
         'produces them (e.g. NaN in the data); training goes on, and this is said once')
  return warned or bool(bad)


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
