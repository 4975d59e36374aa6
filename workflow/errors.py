"""What stops a run of bin/train: each error says what to print and the exit status.

`workflow.training.cli.run_training` raises them; only bin/train exits (`report`
prints the lines and returns the status). Tests and scripts that run
in-process catch them.
"""

import os
import signal
import sys
from collections.abc import Sequence
from typing import Optional


class RunError(Exception):
  """A run that cannot start or go on: `lines` for stderr, `exit_code` for bin/train."""
  exit_code = 1

  def lines(self, program: str) -> list[str]:
    del program
    return [f'error: {self}']


class UsageError(RunError, ValueError):
  """Bad input (a flag, a file): one line naming it, exit status 2, nothing written."""
  exit_code = 2

  def lines(self, program: str) -> list[str]:
    return [f'{program}: error: {self}']


class RunFailed(RunError):
  """The run started and cannot go on (diverged, a write or a worker failed): exit status 1.

  `advice` lines follow the message (where to resume, what to do).
  """

  def __init__(self, message: str, advice: Sequence[str] = ()):
    super().__init__(message)
    self.advice = tuple(advice)

  def lines(self, program: str) -> list[str]:
    return super().lines(program) + list(self.advice)


class Stopped(RunError):
  """SIGINT or SIGTERM: one line saying where a rerun resumes; exit status 128 + signal."""

  def __init__(self, signum: int, where: str):
    super().__init__(f'{signal.Signals(signum).name}: {where}; resume with the same command')
    self.signum = signum
    self.exit_code = 128 + signum

  def lines(self, program: str) -> list[str]:
    del program
    return [str(self)]


# Set to 1 in the environment: `report` prints the error's traceback (and its causes,
# e.g. the user code of a --task that raised) before its lines.
TRACEBACK_ENV = 'TFF_ADAPTIVE_TRACEBACK'


def report(error: RunError, program: Optional[str] = None) -> int:
  """Prints `error` on stderr as bin/train does; returns the status bin/train exits with."""
  program = os.path.basename(sys.argv[0]) if program is None else program
  if os.environ.get(TRACEBACK_ENV, '') not in ('', '0'):
    import traceback  # pylint: disable=g-import-not-at-top
    traceback.print_exception(error, file=sys.stderr)
  for line in error.lines(program):
    print(line, file=sys.stderr, flush=True)
  return error.exit_code
