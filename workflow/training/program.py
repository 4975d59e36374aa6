"""The simulation loop: sample, train a round, evaluate, release, checkpoint.

Program state (the learning process state, the round number and the running
totals) goes through `tff.program.FileProgramStateManager`'s format
(`checkpoint_files`); metrics go to metrics.csv and to TensorBoard scalars as
TFF's `TensorBoardReleaseManager` writes them (`run_files`). A rerun
into the same directory resumes from the latest saved state that loads
(workflow/training/run_files.py's `recover`: damaged checkpoints are set aside, partial
ones removed); rows of
metrics.csv and TensorBoard events of rounds after that state are dropped, so a
crash, Ctrl-C or full disk loses no more than the rounds since the last intact
checkpoint and never duplicates a round. docs/reliability.md lists what is
guaranteed, each failure's message and how to recover by hand.
"""

import asyncio
import collections
import dataclasses
import json
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
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import layout
from workflow.flags import train_flags
from workflow.training import checkpoint_files
from workflow.training import cohort_feed
from workflow.training import divergence
from workflow.training import heartbeat
from workflow.training import run_files


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


# The defaults of the loop's settings that are bin/train flags: the flag table's.
_FLAG_DEFAULTS = train_flags.DEFAULTS


@dataclasses.dataclass
class LoopConfig:
  total_rounds: int
  clients_per_round: int
  rounds_per_eval: int
  rounds_per_checkpoint: int
  output_dir: str
  # Evaluate on every eval_stride-th test example.
  eval_stride: int = _FLAG_DEFAULTS['eval_stride']
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
  divergence_factor: float = _FLAG_DEFAULTS['divergence_factor']
  divergence_rounds: int = _FLAG_DEFAULTS['divergence_rounds']
  # A round still running after this many seconds says so, then every 6x as
  # long (with show_progress; 0: never): a long round shows it is alive.
  heartbeat_seconds: float = 10.0
  # Called after each round; raises to stop the run (bin/train: a signal whose
  # exception the interpreter swallowed, workflow/training/cli.py).
  after_round: Optional[Callable[[], None]] = None
  # Printed when the rounds start (with show_progress): how they run
  # (workflow.training.algorithm_builders.execution_line), after every check that may
  # still refuse the command in one line.
  execution_line: str = ''
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

  def __init__(self, task: task_base.FederatedTask,
               stride: int = _FLAG_DEFAULTS['eval_stride']):
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
  loop = Loop(process, task, config, round_metrics_fn, client_data_fn, feeder)
  await loop.resume()
  bar = loop.progress_bar()
  row = {}
  try:
    for round_num in range(loop.start_round + 1, config.total_rounds + 1):
      config.progress.round_num = round_num
      started = time.monotonic()
      sampled = loop.sample(round_num)
      output, schedule_row = loop.train(round_num, sampled)
      row = await loop.finish_round(round_num, sampled, output, schedule_row, started)
      loop.write_scalars(round_num)
      await loop.checkpoint_if_due(round_num)
      loop.show_progress(bar, round_num, row)
      if config.after_round is not None:
        config.after_round()
  finally:
    bar.close()
  return loop.state, row


class Loop:
  """The training loop's steps and what they carry from round to round.

  `resume` sets the process state, running totals, schedules and client state
  from the newest intact checkpoint (or the initial ones); each step after it
  is one part of a round, in the order `_rounds` calls them.
  """

  def __init__(self, process, task, config, round_metrics_fn, client_data_fn, feeder,
               initial_state=None, evaluate=None, scalars=None):
    self.process, self.task, self.config = process, task, config
    # A population member's own start (its weights and hyperparameters), else initialize()'s.
    self.initial_state = initial_state
    self.round_metrics_fn, self.client_data_fn, self.feeder = (round_metrics_fn, client_data_fn,
                                                               feeder)
    self.sched, self.hook = config.schedules, config.client_state
    self.state_manager = checkpoint_files.ProgramStateManager(
        os.path.join(config.output_dir, 'checkpoints'), keep_total=3, keep_first=False)
    # A population's members of one seed share theirs (together.py).
    self.evaluate = evaluate or KerasEvaluator(task, config.eval_stride)
    # Its TensorBoard scalars wait here until `scalars.write()`; a population's
    # members share one batch, written by one graph call per round.
    self.scalars = scalars or run_files.ScalarBatch()
    self.client_ids = list(task.train_data.client_ids)
    self.divergence_rule = divergence.Rule(config.divergence_factor, config.divergence_rounds)
    self.last_eval = {}
    self.warned_non_finite_eval = False  # said once

  def where_to_resume(self) -> str:
    return run_files.checkpoint_phrase(self.config.output_dir)

  async def resume(self):
    """The program state of the newest intact checkpoint, else the initial one."""
    initial = (self.process.initialize() if self.initial_state is None
               else self.initial_state)
    # Schedules' state is JSON text: feedback windows and plateau counters are
    # small Python structures that a SavedModel does not hold natively.
    # Running totals are JSON text too: their keys (the process's cost metrics)
    # are unknown before the checkpoint is read, and loading needs a structure.
    program_state = {'state': initial, 'totals': '{}',
                     'schedules': self.sched.to_json() if self.sched else ''}
    self.start_round, loaded = await run_files.recover(self.state_manager, self.config.output_dir,
                                             dict(program_state))
    if loaded is not None:
      program_state = loaded
      program_state['state'] = tf.nest.pack_sequence_as(
          initial, tf.nest.flatten(program_state['state']))
      print(f'Resuming from the checkpoint after round {self.start_round}.', file=sys.stderr)
    self._open_releases()
    divergence.forget(self.config.output_dir)
    if self.hook is not None:
      # The client-state snapshot saved with this server checkpoint (0: none).
      self.hook.restore(self.start_round)
    self.state = program_state['state']
    if loaded is not None:
      self.state = with_hparams_of(self.process, self.state, initial)
    if self.sched is not None and program_state.get('schedules'):
      self.sched.restore(_text(program_state['schedules']))
    saved_totals = program_state['totals']
    if isinstance(saved_totals, (bytes, str)):
      saved_totals = json.loads(_text(saved_totals))
    self.totals = collections.defaultdict(float, {k: float(v) for k, v in saved_totals.items()})
    self.config.progress.last_checkpoint = self.start_round
    if self.config.divergence_factor > 0 and self.start_round < self.config.total_rounds:
      # The finite blow-up rule's reference: the initial model's loss.
      self.divergence_rule.set_reference(
          self.evaluate(self.process.get_model_weights(initial)).get('loss'))

  def _open_releases(self):
    # metrics.csv and TensorBoard drop what rounds after the checkpoint wrote.
    try:
      self.releases = run_files.Releases(self.config.output_dir, self.start_round, self.scalars)
    except (OSError, tf.errors.OpError) as e:
      raise WriteFailed(f'cannot write the metrics in {self.config.output_dir} '
                        f'({run_files.first_line(e)}); {self.where_to_resume()}') from None

  def progress_bar(self):
    if self.config.execution_line and self.config.show_progress:
      print(self.config.execution_line, file=sys.stderr)
    # A bar redrawn with carriage returns only reads on a terminal; a log (stderr
    # not a tty) gets the one line per evaluation of `show_progress` instead.
    return tqdm.tqdm(total=self.config.total_rounds, initial=self.start_round, unit='round',
                     disable=not (self.config.show_progress and sys.stderr.isatty()),
                     file=sys.stderr, dynamic_ncols=True)

  def sample(self, round_num: int) -> list[str]:
    return sample_clients(self.client_ids, self.config.clients_per_round, self.config.seed,
                          round_num)

  def train(self, round_num: int, sampled: list[str]):
    """This round's schedules applied, then `process.next`; returns (output, schedule row)."""
    try:
      data, schedule_row = self.prepare(round_num, sampled)
      with heartbeat.while_running(round_num, self.config):
        output = self.process.next(self.state, data)
    except Exception as e:
      self.note_failure(e, round_num)
      raise
    return output, schedule_row

  def note_failure(self, e: Exception, round_num: int) -> None:
    # The caller (bin/train) reports where a rerun resumes; the type is kept.
    e.add_note(f'Round {round_num} failed; {self.where_to_resume()}.')

  def prepare(self, round_num: int, sampled: list[str]):
    """This round's schedules applied to the state; (the clients' data, schedule row)."""
    # Composer-built processes run K steps themselves (K is in their state).
    data_steps = None if _has_round_hparams(self.state) else self.config.local_steps
    schedule_row = {}
    if self.sched is not None:
      self.state, scheduled_steps, schedule_row = self.sched.apply(self.state, round_num)
      data_steps = scheduled_steps if scheduled_steps is not None else data_steps
    return self._client_data(round_num, sampled, data_steps), schedule_row

  async def finish_round(self, round_num: int, sampled: list[str], output, schedule_row,
                         started: float) -> dict:
    """Everything after `process.next` up to the checkpoint: measure, check,
    evaluate, write metrics.csv, add the TensorBoard scalars; the row."""
    row, weights = self.measure(round_num, output)
    try:
      self.divergence_rule.check(round_num, row, weights, self.task, sampled,
                                 self.where_to_resume)
    except divergence.TrainingDiverged as e:
      divergence.record(self.config.output_dir, round_num, str(e))
      raise
    self.state = output.state
    self.update_client_states(round_num, sampled, output, row)
    self.add_totals(row)
    row['round_seconds'] = time.monotonic() - started
    self.evaluate_if_due(round_num, weights, row)
    self.observe_schedules(round_num, schedule_row, len(sampled), row)
    await self.write_metrics(round_num, row)
    return row

  def _client_data(self, round_num: int, sampled: list[str], data_steps: Optional[int]):
    if self.feeder is not None:  # K is this round's (schedules may change it)
      upcoming = (self.sample(round_num + 1) if round_num < self.config.total_rounds
                  else None)
      data = self.feeder(sampled, int(self.state.client_work['local_steps']), upcoming)
    else:
      data = self.client_data_fn(sampled, data_steps)
    if self.hook is not None:  # pair each client's data with its own state
      data = self.hook.client_data(round_num, sampled, data)
    return data

  def measure(self, round_num: int, output):
    """The round's metrics row and the new model weights."""
    # Process measurements: costs keep their `cost/` names (and get running
    # totals below); everything else is a training metric.
    row = {(k if k.startswith('cost/') else f'train/{k}'): v
           for k, v in flatten_metrics(output.metrics).items()}
    if self.round_metrics_fn is not None:
      row.update(self.round_metrics_fn(round_num, output))
    weights = _model_weights(self.process, output.state)
    if self.feeder is not None:
      row['cohort_padding_waste'] = self.feeder.padding_waste
    return row, weights

  def update_client_states(self, round_num: int, sampled: list[str], output, row):
    if self.hook is not None:  # store what the clients returned; user accuracy
      row.update(self.hook.after_round(round_num, sampled, output,
                                       self.config.is_eval_round(round_num)))

  def add_totals(self, row):
    for key, value in list(row.items()):
      if key.startswith('cost/') and not key.endswith('state_floats'):
        self.totals[key] += value
    row.update({f'cost/cumulative_{k[len("cost/"):]}': v for k, v in self.totals.items()})

  def evaluate_if_due(self, round_num: int, weights, row):
    if not self.config.is_eval_round(round_num):
      return
    started = time.monotonic()
    self.last_eval = {f'eval/{k}': v for k, v in self.evaluate(weights).items()}
    row.update(self.last_eval)
    # Beside round_seconds (which excludes it): what evaluation costs a run.
    row['eval_seconds'] = time.monotonic() - started
    self.warned_non_finite_eval = divergence.warn_non_finite_eval(
        self.last_eval, round_num, self.warned_non_finite_eval)

  def observe_schedules(self, round_num: int, schedule_row, num_sampled: int, row):
    if self.sched is not None:
      row.update(schedule_row)
      row.update(self.sched.observe(round_num, row, num_sampled))

  async def write_metrics(self, round_num: int, row):
    try:
      self.releases.release(row, round_num)
    except (OSError, tf.errors.OpError) as e:
      raise self._write_failed(round_num, e) from None

  def write_scalars(self, round_num: int):
    """Writes the TensorBoard scalars waiting in `scalars` (in a population, every member's)."""
    try:
      self.scalars.write()
    except (OSError, tf.errors.OpError) as e:
      raise self._write_failed(round_num, e) from None

  def _write_failed(self, round_num: int, e: Exception) -> 'WriteFailed':
    return WriteFailed(f'could not write the metrics of round {round_num} '
                       f'({run_files.first_line(e)}); {self.where_to_resume()}; free space '
                       'and rerun the same command to resume')

  async def checkpoint_if_due(self, round_num: int):
    last = round_num == self.config.total_rounds
    if not (round_num % self.config.rounds_per_checkpoint == 0 or last):
      return
    # No checkpoint while the loss is blowing up: the one kept is from before.
    if self.divergence_rule.streak != 0 and not last:
      return
    try:
      if self.hook is not None:  # first: a server checkpoint always has its client state
        self.hook.save(round_num)
      await self.state_manager.save(
          {'state': self.state, 'totals': json.dumps(dict(self.totals)),
           'schedules': self.sched.to_json() if self.sched else ''}, round_num)
    except (OSError, tf.errors.OpError) as e:
      run_files.remove_partial_checkpoints(os.path.join(self.config.output_dir, 'checkpoints'))
      raise WriteFailed(f'could not write the checkpoint of round {round_num} '
                        f'({run_files.first_line(e)}); partial files removed; '
                        f'{self.where_to_resume()}; free space and rerun the same command to '
                        'resume') from None
    self.config.progress.last_checkpoint = round_num

  def show_progress(self, bar, round_num: int, row):
    shown = _progress_postfix(row, self.last_eval)
    bar.update(1)
    bar.set_postfix(shown, refresh=False)
    if (not sys.stderr.isatty() and self.config.show_progress
        and round_num % self.config.rounds_per_eval == 0):
      print(f'round {round_num}/{self.config.total_rounds} ' +
            ' '.join(f'{k}={v:.4g}' for k, v in shown.items()), file=sys.stderr, flush=True)


def _text(saved) -> str:
  # A checkpoint gives back JSON text as bytes; a fresh program state holds str.
  return saved.decode() if isinstance(saved, bytes) else str(saved)


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


def _has_round_hparams(state) -> bool:
  return layout.runs_local_steps(state)


def _progress_postfix(row, last_eval):
  shown = {}
  for key, value in row.items():
    if key.endswith('train/loss') or key.endswith('train/sparse_categorical_accuracy'):
      shown['loss' if key.endswith('loss') else 'acc'] = value
  for key, value in last_eval.items():
    shown[key.replace('eval/', 'eval_')] = value
  return {k: round(v, 4) for k, v in shown.items()}
