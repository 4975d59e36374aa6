"""bin/train's flag validation: every check that needs neither the data nor the disk.

`validate(cfg)` raises `errors.UsageError` naming the first bad flag; what the
chosen algorithm supports is its registry entry's to check
(`workflow.algorithms.check`). `check_task_counts` runs once the task is built.
"""

import math
import os
from collections.abc import Mapping
from typing import Any

from workflow import config
from workflow import errors
from workflow import library_flags

UsageError = errors.UsageError

POSITIVE_INTS = ('clients_per_round', 'client_batch_size', 'client_epochs_per_round',
                 'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint', 'sm3_delay',
                 'eval_stride', 'pfedme_inner_steps', 'divergence_rounds', 'schedule_window',
                 'plateau_patience', 'client_lr_decay_steps', 'server_lr_decay_steps')
NON_NEGATIVE_INTS = ('num_clients', 'local_steps', 'max_client_examples', 'seed',
                     'client_lr_warmup_rounds', 'server_lr_warmup_rounds')
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


def validate(cfg: Mapping[str, Any]) -> None:
  """Raises UsageError naming the first bad flag."""
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from workflow import algorithms as algorithm_registry  # pylint: disable=g-import-not-at-top
  if task_registry.is_custom(cfg['task']):
    try:
      task_registry.custom_task_function(cfg['task'])
    except ValueError as e:
      raise UsageError(str(e)) from e  # the cause: user code's traceback (TFF_ADAPTIVE_TRACEBACK)
  elif cfg['task'] not in task_registry.TASKS:
    raise UsageError(f'--task must be one of {", ".join(sorted(task_registry.TASKS))}, or '
                     f'package.module:function; got {cfg["task"]!r}')
  try:
    algorithm_registry.check_known(cfg['algorithm'])
  except algorithm_registry.ConfigError as e:
    raise UsageError(str(e)) from None
  # Every number first: a NaN or inf passes comparisons that forget it (and
  # hangs the DP accountant), so no float flag may hold one.
  for name, value in cfg.items():
    if isinstance(value, float) and not math.isfinite(value):
      raise UsageError(f'--{name} must be a finite number; got {value}')
    _check_text(name, value)
  _check_bounds(cfg)
  for name in POSITIVE_INTS:
    if cfg.get(name) is not None and cfg[name] < 1:
      raise UsageError(f'--{name} must be a positive integer (>= 1); got {cfg[name]}')
  for name in NON_NEGATIVE_INTS:
    if cfg.get(name) is not None and cfg[name] < 0:
      raise UsageError(f'--{name} must be a non-negative integer (>= 0); got {cfg[name]}')
  for name in POSITIVE_FLOATS:
    value = cfg.get(name)
    if value is not None and not value > 0:
      raise UsageError(f'--{name} must be a positive number (> 0); got {value}')
  for name in NON_NEGATIVE_FLOATS:
    value = cfg.get(name)
    if value is not None and not value >= 0:
      raise UsageError(f'--{name} must be a non-negative number (>= 0); got {value}')
  for name in UNIT_INTERVAL:
    value = cfg.get(name)
    if value is not None and not 0 <= value < 1:
      raise UsageError(f'--{name} must be in [0, 1); got {value}')
  for name in CLOSED_UNIT_INTERVAL:
    value = cfg.get(name)
    if value is not None and not 0 <= value <= 1:
      raise UsageError(f'--{name} must be in [0, 1]; got {value}')
  if cfg.get('seed') is not None and cfg['seed'] > MAX_SEED:
    raise UsageError(f'--seed must be in [0, {MAX_SEED}]; got {cfg["seed"]}')
  if cfg.get('execution_concurrency') is not None and cfg['execution_concurrency'] < -1:
    raise UsageError('--execution_concurrency must be -1 (unlimited), 0 (default) or a positive '
                     f'integer; got {cfg["execution_concurrency"]}')
  if cfg.get('local_steps_decay') is not None and not 0 < cfg['local_steps_decay'] <= 1:
    raise UsageError(f'--local_steps_decay must be in (0, 1]; got {cfg["local_steps_decay"]}')
  if cfg.get('divergence_factor') and cfg['divergence_factor'] <= 1:
    raise UsageError('--divergence_factor must be 0 (off) or a number above 1; got '
                     f'{cfg["divergence_factor"]}')
  num_clients, per_round = cfg.get('num_clients'), cfg.get('clients_per_round')
  if num_clients and per_round and per_round > num_clients:
    raise UsageError(f'--clients_per_round must be in [1, --num_clients={num_clients}]; '
                     f'got {per_round}')
  _validate_experiment_name(cfg)
  from tff_adaptive.algorithms import fedopt  # pylint: disable=g-import-not-at-top
  if cfg.get('server_optimizer') and cfg['server_optimizer'] not in fedopt.SERVER_OPTIMIZERS:
    raise UsageError(f'--server_optimizer must be one of {", ".join(fedopt.SERVER_OPTIMIZERS)}; '
                     f'got {cfg["server_optimizer"]!r}')
  if cfg.get('dp'):
    if not cfg.get('dp_clip_norm') or cfg['dp_clip_norm'] <= 0:
      raise UsageError('--dp needs --dp_clip_norm, a positive L2 clip norm C (> 0)')
    if cfg.get('dp_noise_multiplier') is None or cfg['dp_noise_multiplier'] < 0:
      raise UsageError('--dp needs --dp_noise_multiplier, a non-negative noise multiplier σ '
                       '(>= 0)')
  if cfg.get('dp_delta') is not None and not 0 <= cfg['dp_delta'] < 1:
    raise UsageError(f'--dp_delta must be in [0, 1) (0: 1 / number of clients); '
                     f'got {cfg["dp_delta"]}')
  # What the algorithm supports: its registry entry's checks (also run by
  # `algorithms.build`, for callers that skip this validation).
  try:
    algorithm_registry.check(config.from_flags(cfg))  # adapter (issue 25 merge)
  except algorithm_registry.ConfigError as e:
    raise UsageError(str(e)) from None
  if cfg.get('workers') and (cfg.get('aggregator') or 'mean') == 'secure':
    raise UsageError('--aggregator=secure runs on TFF\'s local test context, not on --workers')
  from workflow import schedule_flags  # pylint: disable=g-import-not-at-top
  try:
    schedule_flags.from_config(cfg)
  except ValueError as e:
    raise UsageError(str(e)) from None
  from tff_adaptive.execution import worker_process  # pylint: disable=g-import-not-at-top
  try:
    addresses = worker_process.parse_addresses(cfg.get('workers') or '')
  except ValueError as e:
    raise UsageError(library_flags.flag_message(str(e), config.from_flags(cfg))) from None  # adapter (issue 25 merge)
  if (cfg.get('workers') or '').strip() and not addresses:
    raise UsageError(f'--workers lists no address (host:port,...); got {cfg["workers"]!r} '
                     '(leave the flag out to run locally)')
  if cfg.get('worker_retry') and len(addresses) < 2:
    raise UsageError('--worker_retry needs at least two --workers')
  from workflow import personalization  # pylint: disable=g-import-not-at-top
  try:
    personalization.validate(config.from_flags(cfg))  # adapter (issue 25 merge)
  except ValueError as e:
    raise UsageError(str(e)) from None


# Upper (and lower) bounds beyond which a flag only hangs or overflows (issue 26).
# Dirichlet(α) sampling (NumPy's) takes time ~1/α: 0.1 ms per draw of 50 shares at
# α = 1e-4, 0.5 s at 1e-9, no end at 1e-30; below ~1e-3 every client holds one label anyway.
MIN_DIRICHLET_ALPHA = 1e-4
# The RDP accountant fails numerically above σ ≈ 1e4 (and overflows at 1e154);
# ε is already ≈ 0 at σ = 1000.
MAX_DP_NOISE_MULTIPLIER = 1e3
# The papers use K of tens to hundreds; 2·10⁹ steps is a round that never ends.
MAX_LOCAL_STEPS = 100_000


def _check_bounds(cfg: Mapping[str, Any]) -> None:
  alpha = cfg.get('dirichlet_alpha')
  if alpha is not None and 0 < alpha < MIN_DIRICHLET_ALPHA:
    raise UsageError(f'--dirichlet_alpha must be at least {MIN_DIRICHLET_ALPHA:g} (smaller values '
                     f'give every client one label, and sampling them takes ~1/α time); got {alpha}')
  sigma = cfg.get('dp_noise_multiplier')
  if sigma is not None and sigma > MAX_DP_NOISE_MULTIPLIER:
    raise UsageError(f'--dp_noise_multiplier must be at most {MAX_DP_NOISE_MULTIPLIER:g} (ε is '
                     f'already ≈ 0 there, and the privacy accountant fails beyond); got {sigma}')
  steps = cfg.get('local_steps')
  if steps is not None and steps > MAX_LOCAL_STEPS:
    raise UsageError(f'--local_steps must be at most {MAX_LOCAL_STEPS} per round; got {steps}')


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


def _validate_experiment_name(cfg: Mapping[str, Any]) -> None:
  """The experiment directory must lie inside --root_output_dir."""
  if 'root_output_dir' in cfg and not cfg['root_output_dir']:
    raise UsageError('--root_output_dir must not be empty')
  name = cfg.get('experiment_name') or ''
  parts = name.replace('\\', '/').split('/')
  if name and (os.path.isabs(name) or '\0' in name or
               any(part in ('', '.', '..') for part in parts)):
    raise UsageError(f'--experiment_name must be a relative name inside --root_output_dir '
                     f'(no leading "/", no "." or ".." parts, no empty parts); got {name!r}')


def check_task_counts(cfg: Mapping[str, Any], task) -> None:
  """Counts that the built task must be able to supply (UsageError naming the flag)."""
  population = len(task.train_data.client_ids)
  if cfg.get('num_clients') and cfg['num_clients'] > population:
    raise UsageError(f'--num_clients must be in [1, {population}] for --task={cfg["task"]} '
                     f'(it has {population} clients); got {cfg["num_clients"]}')
  if cfg.get('clients_per_round') and cfg['clients_per_round'] > population:
    raise UsageError(f'--clients_per_round must be in [1, {population}] for --task={cfg["task"]} '
                     f'with these flags (it has {population} clients); '
                     f'got {cfg["clients_per_round"]}')


