"""What `bin/train` does with its flags: validate, prepare the output, run.

Kept out of the binary so that tests (and users' own scripts) can call
`run_training(config)` in-process with a plain dict. It returns the result or
raises a `RunError` (a usage error, a failed run, a stop by signal) that says
what to print and with which status to exit; only bin/train exits.
"""

import errno
import fcntl
import json
import math
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from absl import flags
from absl import logging

from workflow import errors
from workflow import train_flags

# Flags whose change does not alter the computation: allowed on resume.
RESUMABLE_CHANGES = frozenset({'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint',
                               'show_progress', 'execution_concurrency', 'root_output_dir',
                               # Where rounds run, not what they compute: a run
                               # may resume on other or fewer workers.
                               'workers', 'worker_retry', 'data_on_workers',
                               # When to stop a run, not what a round computes.
                               'divergence_factor', 'divergence_rounds',
                               'trust_command_line'})
TRAIN_FLAG_NAMES = train_flags.TRAIN_FLAG_NAMES
POSITIVE_INTS = ('clients_per_round', 'client_batch_size', 'client_epochs_per_round',
                 'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint', 'sm3_delay',
                 'pfedme_inner_steps', 'divergence_rounds', 'schedule_window',
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


# The errors run_training raises (tests and scripts catch them by these names).
RunError, UsageError, RunFailed, Stopped = (errors.RunError, errors.UsageError, errors.RunFailed,
                                            errors.Stopped)
report = errors.report


HELP_ARGS = ('--help', '-help', '-h', '-?', '--helpshort', '-helpshort')


def wants_help(argv) -> bool:
  return any(a in HELP_ARGS for a in argv[1:])


def parse_flags(argv, flag_values: flags.FlagValues = flags.FLAGS):
  """absl's parse of a command line; UsageError (one line) for a bad one.

  Also for a --flagfile that is not text (absl reads it as UTF-8).
  """
  try:
    return flag_values(argv)
  except flags.Error as e:
    raise UsageError(str(e)) from None
  except UnicodeDecodeError as e:
    files = [a.split('=', 1)[1] for a in argv[1:] if a.startswith(('--flagfile=', '-flagfile='))]
    raise UsageError(f'--flagfile={",".join(files) or "?"}: not a text file of flags (byte '
                     f'{e.start} is not UTF-8)') from None


def resolve_flags(flag_values: flags.FlagValues) -> tuple[dict[str, Any], list[str]]:
  """The run config of parsed bin/train flags: --preset, then the algorithm's defaults.

  Flags given on the command line win over the preset, and both over the
  algorithm's defaults (`workflow.algorithms.AlgorithmEntry.defaults`).
  Returns (config, notes): what the preset and the defaults set, one line
  each, for `run_training` to print once the config is known to be valid.
  Raises UsageError for an unknown preset.
  """
  from workflow import algorithms as algorithm_registry  # pylint: disable=g-import-not-at-top
  from workflow import presets  # pylint: disable=g-import-not-at-top
  explicit = train_flags.explicit_flags(flag_values)
  notes = []
  if flag_values['preset'].value:
    name = flag_values['preset'].value
    try:
      applied = presets.apply(name, flag_values)
    except presets.UnknownPresetError as e:
      raise UsageError(str(e)) from None
    notes.append(f'--preset={name} sets {" ".join(applied) or "nothing (all given)"}')
    explicit |= {a[2:].split('=', 1)[0] for a in applied}
  cfg = train_flags.config_from_flags(flag_values)
  cfg, applied = algorithm_registry.apply_defaults(cfg, explicit)
  notes += [f'{cfg["algorithm"]}: {a} (this algorithm\'s default)' for a in applied]
  return cfg, notes


def config_from_args(args, program: str = 'bin/train.py') -> tuple[dict[str, Any], list[str]]:
  """`resolve_flags` of a bin/train command line (without the program), parsed on its own
  FlagValues: what bin/train would run, for tests and scripts that run in-process."""
  values = flags.FlagValues()
  train_flags.define_flags(values)
  try:
    values([program, *args])
  except flags.Error as e:
    raise UsageError(str(e)) from None
  return resolve_flags(values)


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
    algorithm_registry.check(cfg['algorithm'], cfg)
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
    raise UsageError(str(e)) from None
  if (cfg.get('workers') or '').strip() and not addresses:
    raise UsageError(f'--workers lists no address (host:port,...); got {cfg["workers"]!r} '
                     '(leave the flag out to run locally)')
  if cfg.get('worker_retry') and len(addresses) < 2:
    raise UsageError('--worker_retry needs at least two --workers')
  from workflow import personalization  # pylint: disable=g-import-not-at-top
  try:
    personalization.validate(cfg)
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


# Flags that do not name a run: where it runs and for how long (resumable
# changes), where its files and data are.
NOT_IN_NAME = RESUMABLE_CHANGES | {'experiment_name', 'data_dir', 'client_state_dir', 'task',
                                   'algorithm'}
MAX_NAME_SUFFIX = 80


def _name_value(value: Any) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  return repr(value) if isinstance(value, float) else str(value)


def run_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
  """The flags of `cfg` that change the computation and differ from their defaults.

  A flag's default is the algorithm's default where it has one
  (`workflow.algorithms`), else bin/train's. Sorted by flag name.
  """
  from workflow import algorithm_defaults  # pylint: disable=g-import-not-at-top
  defaults = {**train_flags.DEFAULTS, **algorithm_defaults.algorithm_defaults(cfg)}
  return {k: cfg[k] for k in sorted(cfg)
          if k not in NOT_IN_NAME and k in defaults and cfg[k] != defaults[k]}


def task_slug(task: str) -> str:
  """A task name fit for a directory name (`pkg.mod:fn` -> `pkg.mod.fn`)."""
  return task.replace(':', '.').replace(os.sep, '.')


def default_experiment_name(cfg: Mapping[str, Any]) -> str:
  """`<task>_<algorithm>`, then `-flag=value` for each flag of `run_settings`.

  Runs whose computation differs never share a name; rerunning the same
  command (or raising --total_rounds) gives the same name, so it resumes. A
  suffix longer than MAX_NAME_SUFFIX characters, or one whose values had to be
  made fit for a path, keeps its start and ends in a hash of all the settings.
  """
  import hashlib  # pylint: disable=g-import-not-at-top
  base = f'{task_slug(cfg["task"])}_{cfg["algorithm"]}'
  settings = run_settings(cfg)
  if not settings:
    return base
  parts = [f'{k}={_name_value(v)}' for k, v in settings.items()]
  safe = [p.replace(os.sep, '%') for p in parts]
  suffix = '-'.join(safe)
  if len(suffix) > MAX_NAME_SUFFIX or safe != parts:
    digest = hashlib.sha1(json.dumps(parts).encode()).hexdigest()[:8]
    kept = ''
    for p in safe:
      if len(kept) + len(p) + 1 > MAX_NAME_SUFFIX - 9:
        break
      kept += f'-{p}'
    suffix = f'{kept[1:]}-{digest}' if kept else digest
  return f'{base}-{suffix}'


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


def check_data_dir(cfg: Mapping[str, Any]) -> None:
  """--data_dir, when given, must exist (a machine's state, so not in `validate`)."""
  if cfg.get('data_dir') and not os.path.isdir(os.path.expanduser(cfg['data_dir'])):
    raise UsageError(f'--data_dir={cfg["data_dir"]!r} is not a directory')


def check_output_paths(cfg: Mapping[str, Any]) -> None:
  """Where the run will write: inside --root_output_dir, no links, entries of the right kind.

  A machine's state, so not in `validate`; checked before anything is written
  (workflow/run_dir.py says why).
  """
  from workflow import run_dir  # pylint: disable=g-import-not-at-top
  root, out = cfg['root_output_dir'], experiment_dir(cfg)
  try:
    if os.path.lexists(root) and not os.path.isdir(root):
      raise run_dir.PathError(f'--root_output_dir={root} is a file, not a directory')
    run_dir.check_name_fits(root, os.path.relpath(out, root))
    run_dir.check_confined(root, out)
    run_dir.check_writable_dir(out)
    run_dir.check_entries(out)
    if cfg.get('client_state_dir'):
      run_dir.check_writable_dir(cfg['client_state_dir'], flag='--client_state_dir')
  except run_dir.PathError as e:
    raise UsageError(str(e)) from None


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


def experiment_dir(cfg: Mapping[str, Any]) -> str:
  name = cfg.get('experiment_name') or default_experiment_name(cfg)
  return os.path.join(cfg['root_output_dir'], name)


_NO_DEFAULT = object()


def _flag_default(name: str) -> Any:
  """bin/train's default of flag `name` (a sentinel for a flag bin/train does not have)."""
  return train_flags.DEFAULTS.get(name, _NO_DEFAULT)


LOCK_NAME = '.lock'
_held_locks: dict[str, int] = {}  # run directory -> open file descriptor holding its lock


class RunDirectoryBusy(UsageError):
  pass


def lock_run_dir(out: str) -> None:
  """Holds an advisory lock on `out` for this process's life (RunDirectoryBusy if taken).

  `fcntl.flock` on `<out>/.lock`, which records the holder's pid. The kernel
  drops the lock when its holder dies however it dies, so the lock of a dead
  run is simply taken over; the file itself stays.
  """
  if out in _held_locks:
    return
  from workflow import run_dir  # pylint: disable=g-import-not-at-top
  path = os.path.join(out, LOCK_NAME)
  try:
    fd = run_dir.open_file(path, os.O_RDWR | os.O_CREAT)
  except run_dir.PathError as e:
    raise UsageError(str(e)) from None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    holder = os.pread(fd, 64, 0).decode(errors='replace').strip() or 'unknown'
    os.close(fd)
    if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
      raise RunDirectoryBusy(f'{out} is in use by another run (pid {holder}); wait for it to '
                             'end, or use another --experiment_name or --root_output_dir') from None
    raise
  os.ftruncate(fd, 0)
  os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
  _held_locks[out] = fd


def check_not_busy(out: str) -> None:
  """RunDirectoryBusy now if another run holds `out`'s lock (before any slow set-up)."""
  try:
    fd = os.open(os.path.join(out, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
  except OSError:
    return  # no lock file: nobody holds it (or the directory is not there yet)
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except OSError:
    holder = os.pread(fd, 64, 0).decode(errors='replace').strip() or 'unknown'
    raise RunDirectoryBusy(f'{out} is in use by another run (pid {holder}); wait for it to '
                           'end, or use another --experiment_name or --root_output_dir') from None
  finally:
    os.close(fd)


def unlock_run_dir(out: str) -> None:
  fd = _held_locks.pop(out, None)
  if fd is not None:
    os.close(fd)  # releases the lock


def _has_checkpoints(out: str) -> bool:
  try:
    return any(name.startswith('program_state_')
               for name in os.listdir(os.path.join(out, 'checkpoints')))
  except OSError:
    return False


def _read_saved_flags(out: str, cfg: Mapping[str, Any]) -> Any:
  """flags.json's dict; None if absent or unusable and --trust_command_line or no checkpoints."""
  flags_path = os.path.join(out, 'flags.json')
  problem = None
  try:
    with open(flags_path, 'rb') as f:
      saved = json.loads(f.read().decode('utf-8'))
    if not isinstance(saved, dict):
      problem = f'holds a JSON {type(saved).__name__}, not an object of flag values'
  except FileNotFoundError:
    problem = 'is missing'
  except (OSError, UnicodeDecodeError, ValueError) as e:
    problem = f'is unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""})'
  if problem is None:
    return saved
  if not _has_checkpoints(out):
    if problem != 'is missing':
      print(f'warning: {flags_path} {problem}; the run has no checkpoint, so it starts over '
            'and the file is rewritten', file=sys.stderr)
    return None
  if cfg.get('trust_command_line'):
    print(f'warning: {flags_path} {problem}; --trust_command_line: resuming with this '
          'command\'s flags (its hyperparameters replace the checkpoint\'s), recorded anew',
          file=sys.stderr)
    return None
  raise UsageError(f'{flags_path} {problem}, so the flags of the run in {out} are unknown; '
                   'restore the file, or rerun with --trust_command_line if this command has '
                   'the run\'s flags')


def _check_resume_flags(out: str, cfg: Mapping[str, Any]) -> None:
  saved = _read_saved_flags(out, cfg)
  if saved is None:
    return
  # A flag added to bin/train after the run was made is absent from its
  # flags.json: at its default it changes nothing, so the run resumes.
  changed = sorted(k for k in set(saved) | set(cfg)
                   if k not in RESUMABLE_CHANGES and saved.get(k) != cfg.get(k)
                   and not (k not in saved and cfg.get(k) == _flag_default(k)))
  if changed:
    diffs = ', '.join(f'--{k}={cfg.get(k)!r} (saved {saved.get(k)!r})' for k in changed)
    raise UsageError(f'{out} holds a run with different flags: {diffs}; use another '
                     f'--experiment_name or --root_output_dir, or rerun with the saved flags')


def prepare_output_dir(cfg: Mapping[str, Any]) -> str:
  """Checks resume compatibility and writability, locks the directory, records the flags.

  Nothing is written before the checks pass (bar the lock file of an existing
  directory). The lock is held until the process ends (or `unlock_run_dir`).
  """
  from workflow import run_dir  # pylint: disable=g-import-not-at-top
  out = experiment_dir(cfg)
  flags_path = os.path.join(out, 'flags.json')
  if os.path.isdir(out):
    _check_resume_flags(out, cfg)  # before anything is written
  created = []
  try:
    created = run_dir.make_dirs(out)
    lock_run_dir(out)
    probe = os.path.join(out, '.write_probe')
    os.close(run_dir.open_file(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    os.remove(probe)
  except UsageError:
    run_dir.remove_dirs(created)
    raise
  except OSError as e:
    run_dir.remove_dirs(created)
    raise UsageError(f'cannot create the run directory {out} (--root_output_dir='
                     f'{cfg["root_output_dir"]} and --experiment_name='
                     f'{os.path.relpath(out, cfg["root_output_dir"])}): {e.strerror}') from None
  try:
    # Again, now that no other run can change the directory.
    run_dir.check_confined(cfg['root_output_dir'], out)
    run_dir.check_entries(out)
  except run_dir.PathError as e:
    raise UsageError(str(e)) from None
  _check_resume_flags(out, cfg)
  try:
    with run_dir.write_text(flags_path + '.tmp') as f:
      json.dump(dict(cfg), f, indent=1, sort_keys=True)
    os.replace(flags_path + '.tmp', flags_path)
  except run_dir.PathError as e:
    raise UsageError(str(e)) from None
  except OSError as e:
    raise UsageError(f'cannot write {flags_path} ({e.strerror})') from None
  return out


def _round_schedules(cfg, task, process):
  """The K/η/η_s schedule driver; UsageError (naming the flag) if `process` cannot follow it."""
  from tff_adaptive.schedules import driver as round_schedules  # pylint: disable=g-import-not-at-top
  from workflow import schedule_flags  # pylint: disable=g-import-not-at-top
  driver = schedule_flags.from_config(cfg)
  try:
    driver.check_process(process, data_on_workers=bool(cfg.get('data_on_workers')))
  except round_schedules.ScheduleError as e:
    raise UsageError(schedule_flags.flag_error(e)) from None
  if cfg.get('measure_step_time'):
    driver.step_seconds = measure_step_seconds(task)
    print(f'Measured β = {driver.step_seconds * 1e3:.2f} ms per minibatch step', file=sys.stderr)
  return driver


def measure_step_seconds(task, repeats: int = 30) -> float:
  """Seconds of one minibatch SGD step of the task's Keras model on this machine."""
  import time  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model = task.keras_model_fn()
  loss_fn = task.keras_evaluation().loss_fn()  # the loss the task trains with
  optimizer = tf.keras.optimizers.SGD(0.0)
  cid = task.train_data.client_ids[0]
  batch = next(iter(task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid))))
  # Tasks batch as {'x', 'y'} dicts or (x, y) tuples.
  x, y = (batch['x'], batch['y']) if isinstance(batch, Mapping) else batch

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))

  step()
  start = time.perf_counter()
  for _ in range(repeats):
    step()
  return (time.perf_counter() - start) / repeats


def _dp_metrics_fn(cfg, task):
  """ε spent so far (RDP accountant), added to each round's metrics."""
  if not cfg.get('dp'):
    return None
  from tff_adaptive.accounting import privacy  # pylint: disable=g-import-not-at-top
  population = len(task.train_data.client_ids)
  rate = min(1.0, cfg['clients_per_round'] / population)
  delta = cfg.get('dp_delta') or 1.0 / population
  return lambda round_num, output: {
      'dp/epsilon': privacy.epsilon(cfg['dp_noise_multiplier'], rate, round_num, delta),
      'dp/delta': delta}


def _raise_interrupted(signum, frame):
  del frame
  from workflow import program  # pylint: disable=g-import-not-at-top
  raise program.Interrupted(signum)


def install_signal_handlers() -> None:
  """SIGINT and SIGTERM raise `program.Interrupted` (main thread only)."""
  import threading  # pylint: disable=g-import-not-at-top
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)


def _stopped(signum: int, out, progress) -> Stopped:
  """The error of SIGINT/SIGTERM: one line, exit status 128 + signal number (130, 143)."""
  # A second signal now ends the process at once, without a traceback.
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  from workflow import program  # pylint: disable=g-import-not-at-top
  if out is not None:
    program.remove_partial_checkpoints(os.path.join(out, 'checkpoints'))
    # The checkpoints on disk, not what the loop last noted: the signal may
    # land between a save and the note of it.
    when = (f'at round {progress.round_num}' if progress is not None and progress.round_num
            else 'before its first round')
    where = f'stopped {when} ({program.checkpoint_phrase(out)})'
  else:
    where = 'stopped before the first round'
  return Stopped(signum, where)


def run_training(cfg: Mapping[str, Any], notes=()):
  """Validates `cfg`, builds task and algorithm, trains; returns (state, last metrics).

  `notes` (from `resolve_flags`: what a preset and the algorithm's defaults
  set) are printed once the run is known to start.

  Raises:
    UsageError: bad flags or files, found before anything is written.
    RunFailed: the run diverged, could not write, or lost a worker.
    Stopped: SIGINT or SIGTERM (the checkpoint kept says where a rerun resumes).
  """
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  # Explicit, not at import: worker_binary children die with this process,
  # values serialise without TFF's nested copies, and TFF's exit-time noise is
  # disarmed even when the command is refused (tff_adaptive.execution.runtime).
  runtime.track_tff_workers()
  validate(cfg)
  check_data_dir(cfg)
  check_output_paths(cfg)
  check_not_busy(experiment_dir(cfg))
  from workflow import program  # pylint: disable=g-import-not-at-top
  install_signal_handlers()
  state = {'out': None, 'progress': None}
  try:
    return _run_training(cfg, state, notes)
  except program.Interrupted as e:
    raise _stopped(e.signum, state['out'], state['progress']) from None
  except KeyboardInterrupt:
    raise _stopped(signal.SIGINT, state['out'], state['progress']) from None
  finally:
    if state['out'] is not None:
      unlock_run_dir(state['out'])


def _run_training(cfg: Mapping[str, Any], status: dict[str, Any], notes=()):
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from workflow import program  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import data_on_workers  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import remote_context  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import worker_process  # pylint: disable=g-import-not-at-top
  from workflow import algorithms as algorithm_registry  # pylint: disable=g-import-not-at-top
  addresses = worker_process.parse_addresses(cfg.get('workers') or '')
  if addresses:
    # Before building anything: an unreachable worker should fail in seconds.
    try:
      remote_context.set_workers_context(addresses, retry=cfg.get('worker_retry', False))
    except worker_process.WorkerError as e:
      raise RunFailed(str(e)) from None
  # Before building: TFF logs at INFO while it wraps Keras models, which would
  # bury the one-line error of a flag that only the built process can refute.
  logging.set_verbosity(logging.WARNING)
  try:
    task = task_registry.create_task(cfg['task'], {**cfg, 'run_dir': experiment_dir(cfg)})
    check_task_counts(cfg, task)
    process = algorithm_registry.build(cfg['algorithm'], task, cfg)
    schedules = _round_schedules(cfg, task, process)
    client_data_fn = None
    if cfg.get('data_on_workers'):
      process, data_steps = data_on_workers.compose_data_on_workers(
          process, task, cfg.get('local_steps') or None)
      client_data_fn = data_on_workers.client_ids_fn(data_steps)
    fresh = not os.path.exists(os.path.join(experiment_dir(cfg), 'flags.json'))
    out = prepare_output_dir(cfg)
    status['out'] = out
    if fresh:  # the run's settings in TensorBoard's HParams table (once per run)
      from workflow import tensorboard_hparams  # pylint: disable=g-import-not-at-top
      tensorboard_hparams.write_hparams(out, cfg)
    runtime.set_worker_log_dir(out)  # worker.log beside the run's other files
    # Personalised algorithms: noisy clients, the per-client state store
    # (a ClientStateError, a ValueError, names a foreign directory).
    from workflow import personalization  # pylint: disable=g-import-not-at-top
    task, client_state = personalization.setup(cfg, task, process, out, RESUMABLE_CHANGES)
  except UsageError:
    raise
  except ValueError as e:
    raise UsageError(str(e)) from e  # the cause: user code's traceback (TFF_ADAPTIVE_TRACEBACK)
  except OSError as e:  # the client-state store (its directory was checked: a race or a full disk)
    raise UsageError(f'cannot write {e.filename or out}: {e.strerror}') from e
  logging.set_verbosity(logging.WARNING)  # TFF logs every checkpoint at INFO too
  if not addresses:
    runtime.use_local_cpp_context(cfg.get('execution_concurrency', 0),
                                  secure_intrinsics=algorithm_registry.needs_secure_context(cfg))
  divergence_factor = cfg.get('divergence_factor')
  loop = program.LoopConfig(
      total_rounds=cfg['total_rounds'], clients_per_round=cfg['clients_per_round'],
      rounds_per_eval=cfg['rounds_per_eval'], rounds_per_checkpoint=cfg['rounds_per_checkpoint'],
      output_dir=out, seed=cfg['seed'], local_steps=cfg.get('local_steps') or None,
      show_progress=cfg.get('show_progress', True),
      schedules=schedules, client_state=client_state,
      divergence_factor=10.0 if divergence_factor is None else divergence_factor,
      divergence_rounds=cfg.get('divergence_rounds') or 3)
  status['progress'] = loop.progress
  for note in notes:
    print(note, file=sys.stderr)
  where = f' on {len(addresses)} workers ({", ".join(addresses)})' if addresses else ''
  print(f'Training {cfg["algorithm"]} on {cfg["task"]}{where}: output in {out}', file=sys.stderr)
  try:
    result = program.run(process, task, loop, round_metrics_fn=_dp_metrics_fn(cfg, task),
                         client_data_fn=client_data_fn)
  except (program.IncompatibleCheckpoint, program.NoIntactCheckpoint) as e:
    raise UsageError(str(e)) from None
  except (program.TrainingDiverged, program.WriteFailed) as e:
    raise RunFailed(str(e)) from None
  except worker_process.WorkerError as e:
    # One readable message, no TFF traceback: the fix is operational.
    raise RunFailed(str(e), [*getattr(e, '__notes__', ()),
                             'Rerun the same command once the worker is back (or without it in '
                             '--workers) to resume from the last checkpoint.']) from None
  finally:
    runtime.shutdown_workers()
  return result
