"""One die-with-parent helper for every child the package starts."""

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

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

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


def _ignored_signals(pid: int) -> int:
  with open(f'/proc/{pid}/status') as f:
    return int(next(line for line in f if line.startswith('SigIgn:')).split()[1], 16)


@linux_only
@pytest.mark.parametrize('default_sigint', [True, False])
def test_sigint_restored_for_children_of_a_process_that_ignores_it(default_sigint):
  """TFF stops its worker with SIGINT and waits without a limit: a worker that
  inherited "ignore SIGINT" (a background job's child) would hang its parent."""
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    child = subprocess.Popen(['sleep', '60'], stdout=subprocess.DEVNULL,
                             preexec_fn=parent_death.preexec_fn(default_sigint=default_sigint))
  finally:
    signal.signal(signal.SIGINT, previous)
  try:
    time.sleep(0.2)  # the child has exec'd `sleep`
    ignores_sigint = bool(_ignored_signals(child.pid) & (1 << (signal.SIGINT - 1)))
    assert ignores_sigint != default_sigint
    if default_sigint:
      child.send_signal(signal.SIGINT)
      assert child.wait(timeout=10) == -signal.SIGINT
  finally:
    child.kill()
    child.wait()


_WRAPPED_PARENT = textwrap.dedent('''
    import os, signal, subprocess, sys, time
    sys.path.insert(0, {root!r})
    from tff_adaptive.execution import parent_death
    args, fn = parent_death.popen_args(['sleep', '60'], signal.SIGKILL)
    assert fn is None, 'a preexec_fn: Python would run in the forked child'
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # setpriv sets the signal after its own exec: wait until the command runs
    # (a parent dead before that leaves the child running: see popen_args).
    for _ in range(1000):
      with open(f'/proc/{{child.pid}}/cmdline', 'rb') as f:
        if f.read().startswith(b'sleep'):
          break
      time.sleep(0.01)
    print(child.pid, flush=True)
    os._exit(0)
''')

needs_setpriv = pytest.mark.skipif(
    parent_death._exec_prefix(int(signal.SIGKILL), True) is None,  # pylint: disable=protected-access
    reason='no setpriv/env --default-signal here: popen_args falls back to preexec_fn')


@linux_only
@needs_setpriv
def test_popen_args_child_dies_with_its_parent_with_no_python_in_the_child():
  """Without a preexec_fn, subprocess forks no Python-running child (one of TFF's
  worker starts aborted there, and its round waited for it forever)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, '-c', _WRAPPED_PARENT.format(root=root)],
                       capture_output=True, text=True, timeout=60, check=True)
  pid = int(out.stdout.split()[0])
  if not processes.gone([pid], timeout=10, poll=0.05):
    os.kill(pid, signal.SIGKILL)
    pytest.fail('the child outlived its parent')


@linux_only
@needs_setpriv
def test_popen_args_restores_sigint_and_keeps_the_pid():
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    args, fn = parent_death.popen_args(['sleep', '60'], default_sigint=True)
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, preexec_fn=fn)
  finally:
    signal.signal(signal.SIGINT, previous)
  try:
    assert fn is None
    deadline = time.time() + 10
    while time.time() < deadline and not _cmdline(child.pid).startswith('sleep'):
      time.sleep(0.02)
    assert _cmdline(child.pid).startswith('sleep')  # the same pid became the command
    assert not _ignored_signals(child.pid) & (1 << (signal.SIGINT - 1))
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=10) == -signal.SIGINT
  finally:
    child.kill()
    child.wait()


def _cmdline(pid: int) -> str:
  with open(f'/proc/{pid}/cmdline', 'rb') as f:
    return f.read().replace(b'\0', b' ').decode()


def test_popen_args_leaves_a_missing_command_to_fail_in_popen():
  args, _ = parent_death.popen_args(['/no/such/binary', '--x'])
  assert args == ['/no/such/binary', '--x']
  with pytest.raises(FileNotFoundError):
    subprocess.Popen(args)  # pylint: disable=consider-using-with
