"""bin/train's flag validation: every check that needs neither the data nor the disk.

`validate(settings)` raises `errors.UsageError` naming the first bad flag:
generic bounds first (by flag name, from the tables below), then each settings
group's own rules in one function each. What the chosen algorithm supports is
its registry entry's to check (`workflow.algorithms.check`).
`check_task_counts` runs once the task is built.
"""

import math
import os
from typing import Any

from tasks.settings import TaskSettings
from tff_adaptive.algorithms import names as library_names
from workflow import config
from workflow import errors
from workflow import library_flags

UsageError = errors.UsageError

POSITIVE_INTS = ('clients_per_round', 'client_batch_size', 'client_epochs_per_round',
                 'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint', 'sm3_delay',
                 'eval_stride', 'pfedme_inner_steps', 'divergence_rounds', 'schedule_window',
                 'plateau_patience', 'client_lr_decay_steps', 'server_lr_decay_steps')
NON_NEGATIVE_INTS = ('num_clients', 'local_steps', 'max_client_examples', 'seed',
                     'first_eval_round', 'client_lr_warmup_rounds', 'server_lr_warmup_rounds')
POSITIVE_FLOATS = ('client_learning_rate', 'server_learning_rate', 'server_epsilon',
                   'client_epsilon', 'dirichlet_alpha', 'download_mbps', 'upload_mbps',
                   'perfedavg_beta', 'pfedme_personal_learning_rate', 'pfedme_lambda',
                   'pfedme_beta', 'client_lr_decay_rate', 'server_lr_decay_rate')
NON_NEGATIVE_FLOATS = ('fedprox_mu', 'fedmax_beta', 'step_time_seconds', 'synthetic_alpha',
                       'synthetic_beta', 'noise_stddev', 'local_steps_theory_b',
                       'plateau_min_delta', 'divergence_factor')
UNIT_INTERVAL = ('server_beta_1', 'server_beta_2', 'client_beta_1', 'client_beta_2',
                 'sparsity')  # [0, 1)
CLOSED_UNIT_INTERVAL = ('noisy_client_fraction',)  # [0, 1]
MAX_SEED = 2**32 - 1  # NumPy's and TF's seeds
# Upper (and lower) bounds beyond which a flag only hangs or overflows.
# Dirichlet(α) sampling (NumPy's) takes time ~1/α: 0.1 ms per draw of 50 shares at
# α = 1e-4, 0.5 s at 1e-9, no end at 1e-30; below ~1e-3 every client holds one label anyway.
MIN_DIRICHLET_ALPHA = 1e-4
# The RDP accountant fails numerically above σ ≈ 1e4 (and overflows at 1e154);
# ε is already ≈ 0 at σ = 1000.
MAX_DP_NOISE_MULTIPLIER = 1e3
# The papers use K of tens to hundreds; 2·10⁹ steps is a round that never ends.
MAX_LOCAL_STEPS = 100_000

# (flag names, what a value must satisfy, how the message says it), checked in this order.
_TABLES = (
    (POSITIVE_INTS, lambda v: v >= 1, 'a positive integer (>= 1)'),
    (NON_NEGATIVE_INTS, lambda v: v >= 0, 'a non-negative integer (>= 0)'),
    (POSITIVE_FLOATS, lambda v: v > 0, 'a positive number (> 0)'),
    (NON_NEGATIVE_FLOATS, lambda v: v >= 0, 'a non-negative number (>= 0)'),
    (UNIT_INTERVAL, lambda v: 0 <= v < 1, 'in [0, 1)'),
    (CLOSED_UNIT_INTERVAL, lambda v: 0 <= v <= 1, 'in [0, 1]'),
)


def validate(settings: config.Settings) -> None:
  """Raises UsageError naming the first bad flag."""
  _check_task_name(settings.task)
  from workflow import algorithms as algorithm_registry  # pylint: disable=g-import-not-at-top
  try:
    algorithm_registry.check_known(settings.server.algorithm)
  except algorithm_registry.ConfigError as e:
    raise UsageError(str(e)) from None
  _check_generic(settings)
  _check_task(settings.task, settings.client)
  _check_client(settings.client)
  _check_server(settings.server)
  _check_aggregation(settings.aggregation)
  _check_loop(settings.loop)
  _check_reliability(settings.reliability)
  # What the algorithm supports: its registry entry's checks (also run by
  # `algorithms.build`, for callers that skip this validation).
  try:
    algorithm_registry.check(settings)
  except algorithm_registry.ConfigError as e:
    raise UsageError(str(e)) from None
  _check_execution(settings.execution, settings.aggregation)
  _check_schedules(settings)
  check_personalized(settings)


def check_personalized(settings: config.Settings) -> None:
  """Noisy clients and the client-state flags against the algorithm's entry."""
  from workflow import algorithms  # pylint: disable=g-import-not-at-top
  personalized, algorithm = settings.personalized, settings.server.algorithm
  fraction = personalized.noisy_client_fraction or 0.0
  with_ua = algorithms.having('personalized')
  if fraction and algorithm not in with_ua:
    raise UsageError(f'--noisy_client_fraction needs a personalised algorithm '
                     f'({", ".join(with_ua)}) that reports user accuracy')
  if not 0.0 <= fraction < 1.0:
    raise UsageError(f'--noisy_client_fraction must be in [0, 1); got {fraction}')
  if fraction and not (personalized.noise_stddev or 0) > 0:
    raise UsageError(f'--noise_stddev must be positive; got {personalized.noise_stddev}')
  keeping_state = algorithms.having('keeps_client_state')
  if algorithm in keeping_state and settings.execution.data_on_workers:
    raise UsageError(f'--data_on_workers is not available for --algorithm={algorithm} '
                     '(its clients also need their own state from the store)')
  if personalized.client_state_dir and algorithm not in keeping_state:
    raise UsageError('--client_state_dir is only used by algorithms whose clients keep state '
                     f'({", ".join(keeping_state)})')


def _check_task_name(task: TaskSettings) -> None:
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  if task_registry.is_custom(task.task):
    try:
      task_registry.custom_task_function(task.task)
    except ValueError as e:
      raise UsageError(str(e)) from e  # the cause: user code's traceback (TFF_ADAPTIVE_TRACEBACK)
  elif task.task not in task_registry.TASKS:
    raise UsageError(f'--task must be one of {", ".join(sorted(task_registry.TASKS))}, or '
                     f'package.module:function; got {task.task!r}')


def _check_generic(settings: config.Settings) -> None:
  """Rules shared by many flags of every group: finite numbers, UTF-8 text, the tables' bounds.

  These rules go by flag name across groups, so they read the flat view of the
  settings (`flag_values()`), here only; every other check reads its group.
  """
  values = settings.flag_values()
  # Every number first: a NaN or inf passes comparisons that forget it (and
  # hangs the DP accountant), so no float flag may hold one.
  for name, value in values.items():
    if isinstance(value, float) and not math.isfinite(value):
      raise UsageError(f'--{name} must be a finite number; got {value}')
    _check_text(name, value)
  for names, holds, wording in _TABLES:
    for name in names:
      if values[name] is not None and not holds(values[name]):
        raise UsageError(f'--{name} must be {wording}; got {values[name]}')


def _check_task(task: TaskSettings, client: config.ClientSettings) -> None:
  if task.dirichlet_alpha is not None and 0 < task.dirichlet_alpha < MIN_DIRICHLET_ALPHA:
    raise UsageError(f'--dirichlet_alpha must be at least {MIN_DIRICHLET_ALPHA:g} (smaller values '
                     'give every client one label, and sampling them takes ~1/α time); '
                     f'got {task.dirichlet_alpha}')
  per_round = client.clients_per_round
  if task.num_clients and per_round and per_round > task.num_clients:
    raise UsageError(f'--clients_per_round must be in [1, --num_clients={task.num_clients}]; '
                     f'got {per_round}')


def _check_client(client: config.ClientSettings) -> None:
  if client.local_steps is not None and client.local_steps > MAX_LOCAL_STEPS:
    raise UsageError(f'--local_steps must be at most {MAX_LOCAL_STEPS} per round; '
                     f'got {client.local_steps}')


def _check_server(server: config.ServerSettings) -> None:
  known = library_names.FEDOPT_SERVER_OPTIMIZERS
  if server.server_optimizer and server.server_optimizer not in known:
    raise UsageError(f'--server_optimizer must be one of {", ".join(known)}; '
                     f'got {server.server_optimizer!r}')


def _check_aggregation(aggregation: config.AggregationSettings) -> None:
  sigma = aggregation.dp_noise_multiplier
  if sigma is not None and sigma > MAX_DP_NOISE_MULTIPLIER:
    raise UsageError(f'--dp_noise_multiplier must be at most {MAX_DP_NOISE_MULTIPLIER:g} (ε is '
                     f'already ≈ 0 there, and the privacy accountant fails beyond); got {sigma}')
  if aggregation.dp:
    if not aggregation.dp_clip_norm or aggregation.dp_clip_norm <= 0:
      raise UsageError('--dp needs --dp_clip_norm, a positive L2 clip norm C (> 0)')
    if aggregation.dp_noise_multiplier is None or aggregation.dp_noise_multiplier < 0:
      raise UsageError('--dp needs --dp_noise_multiplier, a non-negative noise multiplier σ '
                       '(>= 0)')
  if aggregation.dp_delta is not None and not 0 <= aggregation.dp_delta < 1:
    raise UsageError(f'--dp_delta must be in [0, 1) (0: 1 / number of clients); '
                     f'got {aggregation.dp_delta}')


def _check_loop(loop: config.LoopSettings) -> None:
  if loop.seed is not None and loop.seed > MAX_SEED:
    raise UsageError(f'--seed must be in [0, {MAX_SEED}]; got {loop.seed}')
  _validate_experiment_name(loop)


def _check_reliability(reliability: config.ReliabilitySettings) -> None:
  if reliability.divergence_factor and reliability.divergence_factor <= 1:
    raise UsageError('--divergence_factor must be 0 (off) or a number above 1; got '
                     f'{reliability.divergence_factor}')


def _check_execution(execution: config.ExecutionSettings,
                     aggregation: config.AggregationSettings) -> None:
  if execution.workers and (aggregation.aggregator or 'mean') == 'secure':
    raise UsageError('--aggregator=secure runs on TFF\'s local test context, not on --workers')
  if execution.execution_concurrency is not None and execution.execution_concurrency < -1:
    raise UsageError('--execution_concurrency must be -1 (unlimited), 0 (default) or a positive '
                     f'integer; got {execution.execution_concurrency}')
  from tff_adaptive.execution import worker_process  # pylint: disable=g-import-not-at-top
  try:
    addresses = worker_process.parse_addresses(execution.workers or '')
  except ValueError as e:  # parse_addresses' messages are about --workers alone: no settings needed
    raise UsageError(library_flags.flag_message(str(e))) from None
  if (execution.workers or '').strip() and not addresses:
    raise UsageError(f'--workers lists no address (host:port,...); got {execution.workers!r} '
                     '(leave the flag out to run locally)')
  if execution.worker_retry and len(addresses) < 2:
    raise UsageError('--worker_retry needs at least two --workers')


def _check_schedules(settings: config.Settings) -> None:
  decay = settings.schedules.local_steps_decay
  if decay is not None and not 0 < decay <= 1:
    raise UsageError(f'--local_steps_decay must be in (0, 1]; got {decay}')
  watching = settings.schedules.watching_evaluations()
  if settings.loop.first_eval_round and watching:
    # A step schedule decays on evaluations: skipping them would change the run.
    raise UsageError(f'--first_eval_round must be 0 with {watching[0]} (it watches every '
                     f'evaluation); got {settings.loop.first_eval_round}')
  from workflow import schedule_flags  # pylint: disable=g-import-not-at-top
  try:
    schedule_flags.from_settings(settings)
  except ValueError as e:
    raise UsageError(str(e)) from None


def _check_text(name: str, value: Any) -> None:
  """String flags must be UTF-8 text (TensorFlow's paths and summaries take nothing else)."""
  if not isinstance(value, str):
    return
  if '\0' in value:
    raise UsageError(f'--{name} must not hold a NUL byte; got {value!r}')
  try:
    value.encode('utf-8')
  except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
    raise UsageError(f'--{name} must be UTF-8 text; got bytes that are not: {value!r}') from None


def _validate_experiment_name(loop: config.LoopSettings) -> None:
  """The experiment directory must lie inside --root_output_dir."""
  if not loop.root_output_dir:
    raise UsageError('--root_output_dir must not be empty')
  name = loop.experiment_name or ''
  parts = name.replace('\\', '/').split('/')
  if name and (os.path.isabs(name) or '\0' in name or
               any(part in ('', '.', '..') for part in parts)):
    raise UsageError(f'--experiment_name must be a relative name inside --root_output_dir '
                     f'(no leading "/", no "." or ".." parts, no empty parts); got {name!r}')


def check_task_counts(settings: config.Settings, task) -> None:
  """Counts that the built task must be able to supply (UsageError naming the flag)."""
  population = len(task.train_data.client_ids)
  name, num_clients = settings.task.task, settings.task.num_clients
  per_round = settings.client.clients_per_round
  if num_clients and num_clients > population:
    raise UsageError(f'--num_clients must be in [1, {population}] for --task={name} '
                     f'(it has {population} clients); got {num_clients}')
  if per_round and per_round > population:
    raise UsageError(f'--clients_per_round must be in [1, {population}] for --task={name} '
                     f'with these flags (it has {population} clients); got {per_round}')
