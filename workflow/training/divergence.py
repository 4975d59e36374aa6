"""When the training loop stops a run because training diverged, and what it says.

Two rules: a non-finite training loss or model weight stops the run at once; a
finite loss above `factor` x the initial model's loss for `rounds` consecutive
rounds stops it too (factor 0: only the first rule). Non-finite evaluation
metrics only warn: the model is finite then, so they come from the task's test
data or metric, which stopping the run would not fix. docs/reliability.md lists
the messages.

A stopped run leaves `diverged.json` (its round and message) in its directory,
and a rerun that resumes it removes the file: bin/sweep skips a trial that has
one, since the same seed and rates would most likely stop it again
(`--retry_diverged` runs it anyway).
"""

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from workflow.training import data_checks
from workflow.training import run_dir
from workflow.training import run_files

_ADVICE = 'try a smaller --client_learning_rate or --server_learning_rate'


class TrainingDiverged(RuntimeError):
  pass


def record(output_dir: str, round_num: int, message: str) -> None:
  """Leaves `diverged.json` in the run directory. Best effort: a run whose record
  cannot be written is retried by the next sweep, and its error is what matters."""
  try:
    with run_dir.write_text(os.path.join(output_dir, run_dir.DIVERGED)) as f:
      json.dump({'round': round_num, 'error': message}, f)
  except (OSError, run_dir.PathError):
    pass


def forget(output_dir: str) -> None:
  """Removes the record of an earlier attempt's divergence: this attempt retries it."""
  try:
    os.remove(os.path.join(output_dir, run_dir.DIVERGED))
  except FileNotFoundError:
    pass


def all_finite(structure) -> bool:
  return all(np.all(np.isfinite(np.asarray(v))) for v in tf.nest.flatten(structure)
             if np.issubdtype(np.asarray(v).dtype, np.floating))


def train_loss(row: Mapping[str, float]) -> tuple[str | None, float]:
  """The row's training loss and its key (None, 0.0 when the process reports none)."""
  loss_key = next((k for k in row if k.endswith('train/loss')), None)
  return loss_key, (row[loss_key] if loss_key else 0.0)


class Rule:
  """Both rules over a run's rounds; `streak` counts the rounds above the limit in a row."""

  def __init__(self, factor: float, rounds: int):
    self.factor, self.rounds = factor, rounds
    self.limit, self.streak = math.inf, 0

  def set_reference(self, initial_loss: float | None):
    """The blow-up limit from the initial model's loss (none when that is not a positive number)."""
    if initial_loss is not None and math.isfinite(initial_loss) and initial_loss > 0:
      self.limit = self.factor * initial_loss

  def check(self, round_num: int, row: Mapping[str, float], weights, task,
            sampled: Sequence[str], where_to_resume: Callable[[], str]):
    """Raises TrainingDiverged if the round's loss or weights break a rule.

    `where_to_resume` is called only to word the error: it reads the
    checkpoints directory.
    """
    loss_key, loss = train_loss(row)
    if not math.isfinite(loss) or not all_finite(weights.trainable):
      what = f'{loss_key}={loss}' if not math.isfinite(loss) else 'model weights'
      cause = data_checks.data_problem(task, sampled)  # NaN/inf data: named first
      raise TrainingDiverged(f'training diverged at round {round_num} (non-finite {what}); '
                             f'{cause}{_ADVICE}; {where_to_resume()}.')
    self.streak = self.streak + 1 if loss > self.limit else 0
    if self.streak >= self.rounds:
      raise TrainingDiverged(
          f'training diverged at round {round_num} ({loss_key}={loss:.4g} above '
          f'{self.factor:g} x the initial model\'s loss for {self.streak} rounds; '
          f'--divergence_factor=0 turns this off); {_ADVICE}; {where_to_resume()}.')


def warn_non_finite_eval(metrics: Mapping[str, float], round_num: int, warned: bool) -> bool:
  """Warns (once per run) of non-finite evaluation metrics; returns whether it has warned.

  The run goes on: the model's weights and training loss are finite (checked
  before), so a NaN here comes from the task's evaluation data or metric, which
  stopping the run would not fix. The values are kept in metrics.csv as they are.
  """
  bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
  if bad and not warned:
    run_files.warn(
        f'round {round_num}: evaluation metrics {", ".join(f"{k}={metrics[k]}" for k in bad)} '
        'are not finite while the model\'s weights are: the task\'s test data or metric '
        'produces them (e.g. NaN in the data); training goes on, and this is said once')
  return warned or bool(bad)
