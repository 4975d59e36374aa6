"""bin/train's flag validation: every check that needs neither the data nor the disk.

`validate(settings)` raises `errors.UsageError` naming the first bad flag:
each flag's own checks first (its table entry's `checks`, in table order),
then the rules that relate flags, one function per settings group. What the
chosen algorithm supports is its registry entry's to check
(`workflow.flags.algorithms.check`). `check_task_counts` runs once the task is built.
"""

import math
import os
from typing import Any

from tasks.settings import TaskSettings
from tff_adaptive.algorithms import names as library_names
from workflow import errors
from workflow.flags import config
from workflow.flags import library_flags
from workflow.flags import schedule_flags
from workflow.flags import train_flags


def validate(settings: config.Settings) -> None:
  """Raises UsageError naming the first bad flag."""
  _check_task_name(settings.task)
  from workflow.flags import algorithms as algorithm_registry  # pylint: disable=g-import-not-at-top
  try:
    algorithm_registry.check_known(settings.server.algorithm)
  except algorithm_registry.ConfigError as e:
    raise errors.UsageError(str(e)) from None
  _check_generic(settings)
  _check_task(settings.task, settings.client)
  _check_server(settings.server)
  _check_aggregation(settings.aggregation)
  _validate_experiment_name(settings.loop)
  # What the algorithm supports: its registry entry's checks (also run by
  # `algorithms.build`, for callers that skip this validation).
  try:
    algorithm_registry.check(settings)
  except algorithm_registry.ConfigError as e:
    raise errors.UsageError(str(e)) from None
  _check_execution(settings.execution, settings.aggregation)
  _check_schedules(settings)
  check_personalized(settings)


def check_personalized(settings: config.Settings) -> None:
  """Noisy clients and the client-state flags against the algorithm's entry."""
  from workflow.flags import algorithms  # pylint: disable=g-import-not-at-top
  personalized, algorithm = settings.personalized, settings.server.algorithm
  fraction = personalized.noisy_client_fraction or 0.0
  with_ua = algorithms.having('personalized')
  if fraction and algorithm not in with_ua:
    raise errors.UsageError(f'--noisy_client_fraction needs a personalised algorithm '
                            f'({", ".join(with_ua)}) that reports user accuracy')
  if fraction and not (personalized.noise_stddev or 0) > 0:
    raise errors.UsageError(f'--noise_stddev must be positive; got {personalized.noise_stddev}')
  keeping_state = algorithms.having('keeps_client_state')
  if algorithm in keeping_state and settings.execution.data_on_workers:
    raise errors.UsageError(f'--data_on_workers is not available for --algorithm={algorithm} '
                            '(its clients also need their own state from the store)')
  if personalized.client_state_dir and algorithm not in keeping_state:
    raise errors.UsageError('--client_state_dir is only used by algorithms whose clients keep '
                            f'state ({", ".join(keeping_state)})')


def _check_task_name(task: TaskSettings) -> None:
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  if task_registry.is_custom(task.task):
    try:
      task_registry.custom_task_function(task.task)
    except ValueError as e:
      # The cause: user code's traceback (TFF_ADAPTIVE_TRACEBACK).
      raise errors.UsageError(str(e)) from e
  elif task.task not in task_registry.TASKS:
    raise errors.UsageError(f'--task must be one of {", ".join(sorted(task_registry.TASKS))}, or '
                            f'package.module:function; got {task.task!r}')


def _check_generic(settings: config.Settings) -> None:
  """Rules of every flag: finite numbers, UTF-8 text, then each entry's own checks.

  These rules go by flag name across groups, so they read the flat view of the
  settings (`flag_values()`), here only; every other check reads its group.
  """
  values = settings.flag_values()
  # Every number first: a NaN or inf passes comparisons that forget it (and
  # hangs the DP accountant), so no float flag may hold one.
  for name, value in values.items():
    if isinstance(value, float) and not math.isfinite(value):
      raise errors.UsageError(f'--{name} must be a finite number; got {value}')
    _check_text(name, value)
  for name, value in values.items():
    for check in train_flags.FLAGS_BY_NAME[name].checks:
      problem = check.problem(name, value)
      if problem:
        raise errors.UsageError(problem)


def _check_task(task: TaskSettings, client: config.ClientSettings) -> None:
  per_round = client.clients_per_round
  if task.num_clients and per_round and per_round > task.num_clients:
    raise errors.UsageError(f'--clients_per_round must be in [1, --num_clients='
                            f'{task.num_clients}]; got {per_round}')


def _check_server(server: config.ServerSettings) -> None:
  known = library_names.FEDOPT_SERVER_OPTIMIZERS
  if server.server_optimizer and server.server_optimizer not in known:
    raise errors.UsageError(f'--server_optimizer must be one of {", ".join(known)}; '
                            f'got {server.server_optimizer!r}')


def _check_aggregation(aggregation: config.AggregationSettings) -> None:
  if aggregation.dp:
    if not aggregation.dp_clip_norm or aggregation.dp_clip_norm <= 0:
      raise errors.UsageError('--dp needs --dp_clip_norm, a positive L2 clip norm C (> 0)')
    if aggregation.dp_noise_multiplier is None or aggregation.dp_noise_multiplier < 0:
      raise errors.UsageError('--dp needs --dp_noise_multiplier, a non-negative noise '
                              'multiplier σ (>= 0)')


def _check_execution(execution: config.ExecutionSettings,
                     aggregation: config.AggregationSettings) -> None:
  if execution.workers and (aggregation.aggregator or 'mean') == 'secure':
    raise errors.UsageError('--aggregator=secure runs on TFF\'s local test context, not on '
                            '--workers')
  from tff_adaptive.execution import worker_process  # pylint: disable=g-import-not-at-top
  try:
    addresses = worker_process.parse_addresses(execution.workers or '')
  except ValueError as e:  # parse_addresses' messages are about --workers alone: no settings needed
    raise errors.UsageError(library_flags.flag_message(e)) from None
  if (execution.workers or '').strip() and not addresses:
    raise errors.UsageError('--workers lists no address (host:port,...); got '
                            f'{execution.workers!r} (leave the flag out to run locally)')
  if execution.worker_retry and len(addresses) < 2:
    raise errors.UsageError('--worker_retry needs at least two --workers')


def _check_schedules(settings: config.Settings) -> None:
  watching = schedule_flags.watching_evaluations(settings.schedules)
  if settings.loop.first_eval_round and watching:
    # A step schedule decays on evaluations: skipping them would change the run.
    raise errors.UsageError(f'--first_eval_round must be 0 with {watching[0]} (it watches every '
                            f'evaluation); got {settings.loop.first_eval_round}')
  try:
    schedule_flags.from_settings(settings)
  except ValueError as e:
    raise errors.UsageError(str(e)) from None


def _check_text(name: str, value: Any) -> None:
  """String flags must be UTF-8 text (TensorFlow's paths and summaries take nothing else)."""
  if not isinstance(value, str):
    return
  if '\0' in value:
    raise errors.UsageError(f'--{name} must not hold a NUL byte; got {value!r}')
  try:
    value.encode('utf-8')
  except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
    raise errors.UsageError(f'--{name} must be UTF-8 text; got bytes that are not: '
                            f'{value!r}') from None


def _validate_experiment_name(loop: config.LoopSettings) -> None:
  """The experiment directory must lie inside --root_output_dir."""
  if not loop.root_output_dir:
    raise errors.UsageError('--root_output_dir must not be empty')
  name = loop.experiment_name or ''
  parts = name.replace('\\', '/').split('/')
  if name and (os.path.isabs(name) or '\0' in name or
               any(part in ('', '.', '..') for part in parts)):
    raise errors.UsageError(f'--experiment_name must be a relative name inside --root_output_dir '
                            f'(no leading "/", no "." or ".." parts, no empty parts); got {name!r}')


def check_task_counts(settings: config.Settings, task) -> None:
  """Counts that the built task must be able to supply (UsageError naming the flag)."""
  population = len(task.train_data.client_ids)
  name, num_clients = settings.task.task, settings.task.num_clients
  per_round = settings.client.clients_per_round
  if num_clients and num_clients > population:
    raise errors.UsageError(f'--num_clients must be in [1, {population}] for --task={name} '
                            f'(it has {population} clients); got {num_clients}')
  if per_round and per_round > population:
    raise errors.UsageError(f'--clients_per_round must be in [1, {population}] for --task={name} '
                            f'with these flags (it has {population} clients); got {per_round}')
