"""Child processes that the kernel signals when their parent dies (Linux PR_SET_PDEATHSIG).

The one helper for every process the package starts (TFF's `worker_binary`
from the local context and from `WorkerProcess`, bin/sweep's trials), so that
no child outlives a trainer killed with `kill -9`.

`subprocess.Popen(preexec_fn=...)` runs its function in the forked child
before exec. With threads in the parent (gRPC's, TensorFlow's) only
async-signal-safe work is safe there, and loading a library (`dlopen`, what
`ctypes.CDLL` does) is not: another thread may have held the loader's lock at
fork time. So libc's `prctl` is resolved here, in the parent, when
`preexec_fn` is called, and the child only calls that function pointer with
two integers.

The signal goes when the *thread* that started the child exits (the kernel's
notion of parent): start long-lived children from a long-lived thread.

Even so, any `preexec_fn` makes `subprocess` fork the whole interpreter and run
its after-fork hooks and Python code in the child of a threaded process: a
`worker_binary` child started from TFF's executor thread was seen to abort
there ("Fatal Python error: Aborted") before its exec, and the round then
waited for that worker forever. So `popen_args` prefers no `preexec_fn` at
all: util-linux's `setpriv --pdeathsig` (and coreutils' `env
--default-signal=INT`) set the same things in the child after a plain
fork-exec, then exec the command under the same pid. `preexec_fn` stays the
fallback where those tools are missing. The price: the signal is set a few
milliseconds after `Popen` returns (in setpriv, after its exec), so a parent
killed within that window leaves the child running; `preexec_fn` set it before
`Popen` returned.
"""

import ctypes
import functools
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Optional

_PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Optional[Callable[..., int]]:
  """libc's prctl, loaded once in this (the parent) process; None off Linux."""
  if not sys.platform.startswith('linux'):
    return None
  try:
    return ctypes.CDLL('libc.so.6', use_errno=True).prctl
  except (OSError, AttributeError):
    return None


@functools.cache
def _libc_signal() -> Optional[Callable[..., int]]:
  """libc's signal(), loaded in the parent like `_prctl`."""
  try:
    return ctypes.CDLL('libc.so.6', use_errno=True).signal
  except (OSError, AttributeError):
    return None


def preexec_fn(signum: int = signal.SIGKILL,
               default_sigint: bool = False) -> Optional[Callable[[], None]]:
  """A `Popen` `preexec_fn` that has the child receive `signum` when its parent dies.

  Args:
    signum: the signal (SIGKILL for workers; SIGTERM lets a trial stop cleanly).
    default_sigint: also give the child SIGINT's default action. A process
      started in the background by a non-interactive shell (nohup, CI runners,
      `cmd &`) ignores SIGINT and its children inherit that; TFF stops its
      local worker with SIGINT and then waits for it without a time limit
      (`ServiceManager.__del__`, when a context replaces another), which then
      never returns (observed: a test hung for 28 minutes).

  Returns:
    The function for `preexec_fn`, or None where the kernel has no
    PR_SET_PDEATHSIG (pass None on: the child then simply lacks the guard).
  """
  prctl = _prctl()
  if prctl is None:
    return None
  option, value = _PR_SET_PDEATHSIG, int(signum)  # plain ints: nothing to convert in the child
  reset = _libc_signal() if default_sigint else None
  sigint, default = int(signal.SIGINT), int(signal.SIG_DFL)

  def set_parent_death_signal() -> None:
    prctl(option, value)
    if reset is not None:
      reset(sigint, default)

  return set_parent_death_signal


@functools.cache
def _exec_prefix(signum: int, default_sigint: bool) -> Optional[tuple[str, ...]]:
  """The command prefix that sets the parent-death signal (and SIGINT's
  default) and execs the rest; None where the tools are missing or refuse."""
  setpriv, env = shutil.which('setpriv'), shutil.which('env')
  if not sys.platform.startswith('linux') or setpriv is None:
    return None
  prefix = (setpriv, '--pdeathsig', signal.Signals(signum).name[3:])
  if default_sigint:
    if env is None:
      return None
    prefix = (env, '--default-signal=INT') + prefix
  try:
    probe = subprocess.run([*prefix, 'true'], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10,
                           check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  return prefix if probe.returncode == 0 else None


def popen_args(args, signum: int = signal.SIGKILL,
               default_sigint: bool = False) -> tuple[list, Optional[Callable[[], None]]]:
  """(argv, preexec_fn) for `subprocess.Popen`: the child gets `signum` when its
  parent dies (and SIGINT's default action with `default_sigint`, see
  `preexec_fn`). Through `setpriv`/`env` when present (no Python runs in the
  child: `preexec_fn` is None), else the plain argv with `preexec_fn`."""
  prefix = _exec_prefix(int(signum), default_sigint)
  # A command that cannot start fails in Popen, as without the prefix (the
  # prefix would report it as the tool's exit status instead).
  if prefix is not None and shutil.which(str(args[0])) is not None:
    return [*prefix, *args], None
  return list(args), preexec_fn(signum, default_sigint)
