"""The run directory on disk: writes that stay inside it, checked before anything is written.

A shared `--root_output_dir` (such as /tmp) lets anyone plant symbolic links
where a run will write: the run directory itself, its `.lock`, `metrics.csv`,
`flags.json`, `tensorboard/`, `checkpoints/` or client-state store.
So, before the first byte is written:

  * the run directory must resolve inside the resolved `--root_output_dir`
    (a link on the way that leads out is refused, naming it);
  * the run directory must hold no symbolic link at all (none is ever made
    by a run), and the entries a run writes must be of the right kind (a
    file where a file is written, a writable directory where one is);

and the files this program writes itself are opened with `O_NOFOLLOW`, so a
link planted after the check fails the write instead of following it.
Every refusal is a `PathError` (a ValueError) whose one-line message names
the path and what to do.
"""

import errno
import os
from collections.abc import Iterable
from typing import Optional

# Left by a run the divergence rule stopped (workflow/training/divergence.record); bin/sweep
# reads it by this name (workflow/sweeps/sweep.DIVERGED).
DIVERGED = 'diverged.json'
# What a run writes in its directory: files, and directories (written by TF/TFF).
FILES = ('.lock', 'flags.json', 'metrics.csv', 'worker.log', DIVERGED)
DIRECTORIES = ('tensorboard', 'checkpoints', 'client_state')
# Room left in a path for what a run writes below its directory
# (checkpoints/program_state_N_temp.../variables/variables.data-00000-of-00001).
_ROOM_BELOW = 160


class PathError(ValueError):
  """A path a run would write through that leads elsewhere or is of the wrong kind."""


def _remedy(flag: str = '--experiment_name or --root_output_dir') -> str:
  return f'remove it, or use another {flag}'


def check_name_fits(root: str, name: str) -> None:
  """PathError naming --experiment_name if the run directory's path cannot exist on this system.

  Each part at most NAME_MAX bytes, the whole path (with room for the files a
  run writes below it) at most PATH_MAX: otherwise creating it fails half-way
  and leaves directories behind.
  """
  name_max, path_max = 255, 4096
  try:
    name_max = os.pathconf(_nearest_existing(root), 'PC_NAME_MAX')
    path_max = os.pathconf(_nearest_existing(root), 'PC_PATH_MAX')
  except (OSError, ValueError):
    pass
  for part in name.split('/'):
    if len(os.fsencode(part)) > name_max:
      raise PathError(f'--experiment_name: the part {part[:40]!r}... is {len(os.fsencode(part))} '
                      f'bytes long; a file name may have at most {name_max}')
  full = os.fsencode(os.path.abspath(os.path.join(root, name)))
  if len(full) + _ROOM_BELOW > path_max:
    raise PathError(f'--experiment_name: the run directory\'s path would be {len(full)} bytes '
                    f'long; with the files a run writes below it, a path may have at most '
                    f'{path_max - _ROOM_BELOW}')


def _nearest_existing(path: str) -> str:
  path = os.path.abspath(path)
  while not os.path.lexists(path):
    path = os.path.dirname(path)
  return path


def check_confined(root: str, out: str) -> None:
  """PathError naming the symbolic link if `out` resolves outside the resolved `root`."""
  real_root = os.path.realpath(root)
  if _inside(os.path.realpath(out), real_root):
    return
  # Name the link that leads out: the first part of the name below the root that is one.
  path = os.path.abspath(root)
  for part in os.path.relpath(os.path.abspath(out), os.path.abspath(root)).split(os.sep):
    path = os.path.join(path, part)
    if os.path.islink(path) and not _inside(os.path.realpath(path), real_root):
      raise PathError(f'{path} is a symbolic link to {os.readlink(path)}, outside '
                      f'--root_output_dir={root}; a run writes only inside --root_output_dir: '
                      f'{_remedy()}')
  raise PathError(f'the run directory {out} resolves to {os.path.realpath(out)}, outside '
                  f'--root_output_dir={root}: use another --experiment_name')


def _inside(path: str, directory: str) -> bool:
  return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def check_entries(out: str) -> None:
  """PathError if the existing run directory holds a link, or an entry of the wrong kind."""
  if not os.path.isdir(out):
    return
  for name in FILES:
    path = os.path.join(out, name)
    if os.path.isdir(path) and not os.path.islink(path):
      raise PathError(f'{path} is a directory, where the run keeps a file: {_remedy()}')
  for name in DIRECTORIES:
    check_writable_dir(os.path.join(out, name))
  for where, dirs, files in os.walk(out):
    for name in dirs + files:
      path = os.path.join(where, name)
      if os.path.islink(path):
        raise PathError(f'{path} is a symbolic link (to {os.readlink(path)}); a run directory '
                        f'holds no links, so that nothing is written outside it: {_remedy()}')


def check_writable_dir(path: str, flag: Optional[str] = None) -> None:
  """PathError unless `path` is absent (and can be made) or is a directory this process can write.

  `flag`: the flag that named `path` (a directory given by the user, which may
  be a link); None: a directory of the run, which may not.
  """
  what = f'{flag}={path}' if flag else path
  remedy = f'use another {flag}' if flag else 'use another --experiment_name or --root_output_dir'
  if os.path.lexists(path):
    if os.path.islink(path) and flag is None:
      raise PathError(f'{path} is a symbolic link (to {os.readlink(path)}); a run directory '
                      f'holds no links, so that nothing is written outside it: remove it, or '
                      f'{remedy}')
    if not os.path.isdir(path):
      raise PathError(f'{what} is a file, not a directory: remove it, or {remedy}')
    if not os.access(path, os.W_OK | os.X_OK):
      raise PathError(f'{what} is a directory this user cannot write (read-only): make it '
                      f'writable, or {remedy}')
    return
  parent = _nearest_existing(path)
  if not os.path.isdir(parent):
    raise PathError(f'{what} cannot be created: {parent} is a file, not a directory; {remedy}')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise PathError(f'{what} cannot be created: {parent} is not writable by this user; {remedy}')


def open_file(path: str, flags: int, mode: int = 0o644) -> int:
  """`os.open` of a run's own file that never follows a symbolic link (PathError naming it)."""
  try:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise PathError(f'{path} is a symbolic link; a run directory holds no links, so that '
                      f'nothing is written outside it: {_remedy()}') from None
    if e.errno == errno.EISDIR:
      raise PathError(f'{path} is a directory, where the run keeps a file: {_remedy()}') from None
    raise


def write_text(path: str, mode: str = 'w'):
  """Opens `path` for text writing ('w' truncates, 'a' appends) without following a link."""
  flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == 'a' else os.O_TRUNC)
  return os.fdopen(open_file(path, flags), mode, newline='')


def make_dirs(path: str) -> list[str]:
  """Creates `path` and its missing parents; returns those it created.

  If creating one fails, the ones created before are removed again (a
  rejected name leaves no directories behind) and the OSError is raised.
  """
  missing = []
  probe = os.path.abspath(path)
  while not os.path.lexists(probe):
    missing.append(probe)
    probe = os.path.dirname(probe)
  created = []
  try:
    for directory in reversed(missing):
      os.mkdir(directory)
      created.append(directory)
  except OSError:
    remove_dirs(created)
    raise
  return created


def remove_dirs(created: Iterable[str]) -> None:
  """Removes directories made by `make_dirs` that are still empty, deepest first."""
  for directory in sorted(created, key=len, reverse=True):
    try:
      os.rmdir(directory)
    except OSError:
      pass
