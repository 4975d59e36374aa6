"""A run's name and directory: the default experiment name, the output checks, the lock, resume.

`prepare_output_dir` is what bin/train does to its run directory before the
first round: the flags of an existing run must match (`RESUMABLE_CHANGES`
aside), the directory must be writable and confined to --root_output_dir
(workflow/training/run_dir.py), and it is locked for the life of the process.
"""

import errno
import fcntl
import json
import os
import sys
from typing import Any

from workflow import errors
from workflow.flags import config
from workflow.flags import schedule_flags
from workflow.flags import train_flags

# Flags whose change does not alter the computation: allowed on resume.
RESUMABLE_CHANGES = frozenset({'total_rounds', 'rounds_per_eval', 'first_eval_round',
                               'rounds_per_checkpoint',
                               'show_progress', 'execution_concurrency', 'intra_op_threads',
                               'root_output_dir',
                               # Where rounds run, not what they compute: a run
                               # may resume on other or fewer workers.
                               'workers', 'worker_retry', 'data_on_workers',
                               # How a round runs, not its math (equal within
                               # float order, tests/test_cohort.py): a run may
                               # resume under the other execution.
                               'execution', 'cohort_mode', 'cohort_jit_compile',
                               # When to stop a run, not what a round computes.
                               'divergence_factor', 'divergence_rounds',
                               'trust_command_line',
                               # Which other runs share this one's process.
                               'together'})

# Flags that name a file or directory: a run resumes with the same place written
# another way (relative to the working directory, or absolute).
PATH_FLAGS = frozenset({'data_dir', 'client_state_dir', 'pretrained_weights'})

# Flags that do not name a run: where it runs and for how long (resumable
# changes), where its files and data are.
NOT_IN_NAME = RESUMABLE_CHANGES | {'experiment_name', 'data_dir', 'client_state_dir', 'task',
                                   'algorithm'}
MAX_NAME_SUFFIX = 80


def _name_value(value: Any) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  return repr(value) if isinstance(value, float) else str(value)


def run_settings(settings: config.Settings) -> dict[str, Any]:
  """{flag: value} of the settings that change the computation and differ from their defaults.

  A flag's default is the algorithm's default where it has one
  (`workflow.flags.algorithms`), else bin/train's. Sorted by flag name.
  """
  from workflow.flags import algorithms  # pylint: disable=g-import-not-at-top  (imports TFF)
  # A run's name lists flags by name, whatever their group: the flat view.
  values = settings.flag_values()
  defaults = {**train_flags.DEFAULTS, **algorithms.algorithm_defaults(settings)}
  return {k: values[k] for k in sorted(values)
          if k not in NOT_IN_NAME and k in defaults and values[k] != defaults[k]}


def task_slug(task: str) -> str:
  """A task name fit for a directory name (`pkg.mod:fn` -> `pkg.mod.fn`)."""
  return task.replace(':', '.').replace(os.sep, '.')


def default_experiment_name(settings: config.Settings) -> str:
  """`<task>_<algorithm>`, then `-flag=value` for each flag of `run_settings`.

  Runs whose computation differs never share a name; rerunning the same
  command (or raising --total_rounds) gives the same name, so it resumes. A
  suffix longer than MAX_NAME_SUFFIX characters, or one whose values had to be
  made fit for a path, keeps its start and ends in a hash of all the settings.
  """
  import hashlib  # pylint: disable=g-import-not-at-top
  base = f'{task_slug(settings.task.task)}_{settings.server.algorithm}'
  differing = run_settings(settings)
  if not differing:
    return base
  parts = [f'{k}={_name_value(v)}' for k, v in differing.items()]
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


def check_data_dir(settings: config.Settings) -> None:
  """--data_dir, when given, must exist (a machine's state, so not in `validate`)."""
  data_dir = settings.task.data_dir
  if data_dir and not os.path.isdir(os.path.expanduser(data_dir)):
    raise errors.UsageError(f'--data_dir={data_dir!r} is not a directory')


def check_output_paths(settings: config.Settings) -> None:
  """Where the run will write: inside --root_output_dir, no links, entries of the right kind.

  A machine's state, so not in `validate`; checked before anything is written
  (workflow/training/run_dir.py says why).
  """
  from workflow.training import run_dir  # pylint: disable=g-import-not-at-top
  root, out = settings.loop.root_output_dir, experiment_dir(settings)
  state_dir = settings.personalized.client_state_dir
  try:
    if os.path.lexists(root) and not os.path.isdir(root):
      raise run_dir.PathError(f'--root_output_dir={root} is a file, not a directory')
    run_dir.check_name_fits(root, os.path.relpath(out, root))
    run_dir.check_confined(root, out)
    run_dir.check_writable_dir(out)
    run_dir.check_entries(out)
    if state_dir:
      run_dir.check_writable_dir(state_dir, flag='--client_state_dir')
  except run_dir.PathError as e:
    raise errors.UsageError(str(e)) from None


def experiment_dir(settings: config.Settings) -> str:
  name = settings.loop.experiment_name or default_experiment_name(settings)
  return os.path.join(settings.loop.root_output_dir, name)


_NO_DEFAULT = object()


def _flag_default(name: str) -> Any:
  """bin/train's default of flag `name` (a sentinel for a flag bin/train does not have)."""
  return train_flags.DEFAULTS.get(name, _NO_DEFAULT)


LOCK_NAME = '.lock'
_held_locks: dict[str, int] = {}  # run directory -> open file descriptor holding its lock


class RunDirectoryBusy(errors.UsageError):
  pass


def lock_run_dir(out: str) -> None:
  """Holds an advisory lock on `out` for this process's life (RunDirectoryBusy if taken).

  `fcntl.flock` on `<out>/.lock`, which records the holder's pid. The kernel
  drops the lock when its holder dies however it dies, so the lock of a dead
  run is simply taken over; the file itself stays.
  """
  if out in _held_locks:
    return
  from workflow.training import run_dir  # pylint: disable=g-import-not-at-top
  path = os.path.join(out, LOCK_NAME)
  try:
    fd = run_dir.open_file(path, os.O_RDWR | os.O_CREAT)
  except run_dir.PathError as e:
    raise errors.UsageError(str(e)) from None
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


def _read_saved_flags(out: str, trust_command_line: bool) -> Any:
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
  if trust_command_line:
    print(f'warning: {flags_path} {problem}; --trust_command_line: resuming with this '
          'command\'s flags (its hyperparameters replace the checkpoint\'s), recorded anew',
          file=sys.stderr)
    return None
  raise errors.UsageError(
      f'{flags_path} {problem}, so the flags of the run in {out} are unknown; restore the '
      'file, or rerun with --trust_command_line if this command has the run\'s flags')


def _same_value(name: str, saved, value) -> bool:
  if name in PATH_FLAGS and saved and value and isinstance(saved, str) and isinstance(value, str):
    return os.path.realpath(saved) == os.path.realpath(value)
  return saved == value


def _check_resume_flags(out: str, settings: config.Settings) -> None:
  saved = _read_saved_flags(out, settings.reliability.trust_command_line)
  if saved is None:
    return
  # flags.json is the flat {flag: value}: compared flag by flag with the
  # flat view of these settings.
  values = settings.flag_values()
  resumable = RESUMABLE_CHANGES
  watching = schedule_flags.watching_evaluations(settings.schedules)
  if watching:  # evaluations decay the schedule
    resumable = resumable - {'rounds_per_eval'}
  # A flag added to bin/train after the run was made is absent from its
  # flags.json: at its default it changes nothing, so the run resumes.
  changed = sorted(k for k in set(saved) | set(values)
                   if k not in resumable and not _same_value(k, saved.get(k), values.get(k))
                   and not (k not in saved and values.get(k) == _flag_default(k)))
  if changed:
    diffs = ', '.join(f'--{k}={values.get(k)!r} (saved {saved.get(k)!r})' for k in changed)
    if 'rounds_per_eval' in changed:
      diffs += f' ({watching[0]} decays on evaluations)'
    raise errors.UsageError(
        f'{out} holds a run with different flags: {diffs}; use another --experiment_name or '
        '--root_output_dir, or rerun with the saved flags')


def prepare_output_dir(settings: config.Settings) -> str:
  """Checks resume compatibility and writability, locks the directory, records the flags.

  Nothing is written before the checks pass (bar the lock file of an existing
  directory). The lock is held until the process ends (or `unlock_run_dir`).
  """
  from workflow.training import run_dir  # pylint: disable=g-import-not-at-top
  out = experiment_dir(settings)
  root = settings.loop.root_output_dir
  flags_path = os.path.join(out, 'flags.json')
  if os.path.isdir(out):
    _check_resume_flags(out, settings)  # before anything is written
  created = []
  try:
    created = run_dir.make_dirs(out)
    lock_run_dir(out)
    probe = os.path.join(out, '.write_probe')
    os.close(run_dir.open_file(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    os.remove(probe)
  except errors.UsageError:
    run_dir.remove_dirs(created)
    raise
  except OSError as e:
    run_dir.remove_dirs(created)
    raise errors.UsageError(
        f'cannot create the run directory {out} (--root_output_dir={root} and '
        f'--experiment_name={os.path.relpath(out, root)}): {e.strerror}') from None
  try:
    # Again, now that no other run can change the directory.
    run_dir.check_confined(root, out)
    run_dir.check_entries(out)
  except run_dir.PathError as e:
    raise errors.UsageError(str(e)) from None
  _check_resume_flags(out, settings)
  try:
    with run_dir.write_text(flags_path + '.tmp') as f:
      json.dump(settings.flag_values(), f, indent=1, sort_keys=True)
    os.replace(flags_path + '.tmp', flags_path)
  except run_dir.PathError as e:
    raise errors.UsageError(str(e)) from None
  except OSError as e:
    raise errors.UsageError(f'cannot write {flags_path} ({e.strerror})') from None
  return out


