"""One die-with-parent helper for every child the package starts (issue 25)."""

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import processes  # pylint: disable=g-bad-import-order

from tff_adaptive.execution import parent_death

linux_only = pytest.mark.skipif(not sys.platform.startswith('linux'),
                                reason='PR_SET_PDEATHSIG is Linux only')

# A parent that starts `sleep` with the helper, prints the child's pid and
# exits at once (os._exit: no atexit, no cleanup, as under `kill -9`).
_PARENT = textwrap.dedent('''
    import ctypes, os, signal, subprocess, sys
    sys.path.insert(0, {root!r})
    from tff_adaptive.execution import parent_death
    fn = parent_death.preexec_fn(signal.SIGKILL)
    def no_dlopen(*args, **kwargs):
      raise AssertionError('dlopen after fork')
    ctypes.CDLL = no_dlopen  # the child must not load libc: it was resolved above
    child = subprocess.Popen(['sleep', '60'], preexec_fn=fn, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    print(child.pid, flush=True)
    os._exit(0)
''')


@linux_only
def test_child_dies_with_its_parent_without_loading_libc_after_fork():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, '-c', _PARENT.format(root=root)], capture_output=True,
                       text=True, timeout=60, check=True)
  pid = int(out.stdout.split()[0])
  if not processes.gone([pid], timeout=10, poll=0.05):
    os.kill(pid, signal.SIGKILL)
    pytest.fail('the child outlived its parent')


@linux_only
def test_without_the_helper_the_child_outlives_its_parent():
  """The check above can fail: a plain child survives the same parent."""
  code = ('import subprocess, os; '
          'p = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL, '
          'stderr=subprocess.DEVNULL); '
          'print(p.pid, flush=True); os._exit(0)')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       timeout=60, check=True)
  pid = int(out.stdout.split()[0])
  time.sleep(0.5)
  try:
    assert processes.alive(pid)
  finally:
    os.kill(pid, signal.SIGKILL)


def test_resolved_in_the_parent(monkeypatch):
  parent_death._prctl.cache_clear()  # pylint: disable=protected-access
  calls = []
  real = ctypes.CDLL
  monkeypatch.setattr(ctypes, 'CDLL', lambda *a, **k: calls.append(a) or real(*a, **k))
  fn = parent_death.preexec_fn()
  if not sys.platform.startswith('linux'):
    assert fn is None
    return
  assert calls == [('libc.so.6',)]
  parent_death.preexec_fn(signal.SIGTERM)
  assert len(calls) == 1  # loaded once per process
