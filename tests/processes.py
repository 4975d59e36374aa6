"""Whether processes are alive: for the tests of children that must not outlive their parent."""

import time


def alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie does not)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


def gone(pids, timeout: float = 15.0, poll: float = 0.1) -> bool:
  """Whether every one of `pids` has stopped within `timeout` seconds."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if not any(alive(p) for p in pids):
      return True
    time.sleep(poll)
  return False
