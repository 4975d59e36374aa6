"""No TFF worker_binary outlives the process that started it."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import processes  # pylint: disable=g-bad-import-order

from tff_adaptive.execution import runtime

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent('''
    import os, sys, time
    sys.path.insert(0, {root!r})
    import tensorflow as tf
    import tensorflow_federated as tff
    from tff_adaptive.execution import runtime
    runtime.use_local_cpp_context()
    @tff.tensorflow.computation(tf.int32)
    def add_one(x):
      return x + 1
    assert add_one(1) == 2
    print('WORKERS', ' '.join(map(str, runtime.live_workers())), flush=True)
    sys.stdin.readline()  # the test checks the workers are alive before we go on
    mode = sys.argv[1]
    if mode == 'raise':
      raise RuntimeError('boom')
    if mode == 'wait':
      time.sleep(120)
''')


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _default_signals():
  # A child inherits "ignored" dispositions and blocked signals across exec.
  # This test is about what the runtime does when the child gets the signal, not
  # about what the pytest worker inherited from the tests it ran before (a
  # child that slept its 120 s through SIGINT, and once SIGTERM, exiting 0, was
  # seen only in the full suite); children of a process that ignores SIGINT are
  # test_parent_death's.
  for s in _SIGNALS:
    signal.signal(s, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


def _start(mode, err):
  proc = subprocess.Popen([sys.executable, '-c', SCRIPT.format(root=ROOT), mode],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                          preexec_fn=_default_signals)
  for line in proc.stdout:
    if line.startswith('WORKERS'):
      pids = [int(p) for p in line.split()[1:]]
      assert pids and all(processes.alive(p) for p in pids)
      proc.stdin.write('go\n')
      proc.stdin.close()
      return proc, pids
  raise AssertionError(f'child exited early: {proc.wait()}')


# How the child ends: bin/train's SystemExit(128 + 15) for SIGTERM (runtime's handler).
_EXIT_STATUS = {'exit': 0, 'raise': 1, signal.SIGINT: -signal.SIGINT,
                signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGKILL: -signal.SIGKILL}


@pytest.mark.parametrize('how', ['exit', 'raise', signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_worker_does_not_outlive_parent(how, tmp_path):
  with open(tmp_path / 'stderr', 'w') as err:
    proc, pids = _start(how if isinstance(how, str) else 'wait', err)
    if not isinstance(how, str):
      proc.send_signal(how)
    # The pipe closing proves the worker no longer holds our stdout.
    proc.stdout.read()
    proc.wait(timeout=60)
  # A signal the child let pass would end it only after its 120 s sleep (seen once in
  # the suite, 128 s for SIGTERM, not reproduced alone): that is a failure, not a pass.
  assert proc.returncode == _EXIT_STATUS[how], (
      f'child ended with {proc.returncode}; its stderr ends: {(tmp_path / "stderr").read_text()[-2000:]}')
  assert processes.gone(pids), f'worker(s) {pids} still running after parent {how}'


def test_every_worker_child_is_tracked():
  # Tests in this process may have started TFF's local context; any
  # worker_binary child must be one `shutdown_workers()` knows about.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  runtime.use_local_cpp_context()

  @tff.tensorflow.computation(tf.int32)
  def add_one(x):
    return x + 1

  assert add_one(1) == 2
  children = set(runtime.find_worker_processes(parent_pid=os.getpid()))
  assert children and children <= set(runtime.live_workers())


DEFAULT_CONTEXT_SCRIPT = textwrap.dedent('''
    import sys
    sys.path.insert(0, {root!r})
    import tensorflow as tf
    import tensorflow_federated as tff
    from tff_adaptive.algorithms import composer  # importing tracks nothing (test_layering)
    from tff_adaptive.execution import runtime
    runtime.track_tff_workers()  # what a library user calls once; no context set
    @tff.tensorflow.computation(tf.int32)
    def add_one(x):
      return x + 1
    assert add_one(1) == 2  # TFF's own default context starts a worker
    print('WORKERS', ' '.join(map(str, runtime.live_workers())), flush=True)
''')


def test_worker_of_tffs_default_context_does_not_outlive_parent():
  """A program that asks for tracking but keeps TFF's default context (no `use_local_cpp_context`)."""
  proc = subprocess.run([sys.executable, '-c', DEFAULT_CONTEXT_SCRIPT.format(root=ROOT)],
                        capture_output=True, text=True, timeout=300, check=True)
  line = next(l for l in proc.stdout.splitlines() if l.startswith('WORKERS'))
  pids = [int(p) for p in line.split()[1:]]
  assert pids, 'TFF started no tracked worker'
  assert processes.gone(pids), f'worker(s) {pids} of TFF\'s default context outlived the program'


def test_a_second_context_after_shutdown_prints_no_tff_noise():
  """Two runs in one process: the first run's stopped worker is not signalled again.

  TFF's ServiceManager.__del__ (when the second context replaces the first)
  would `os.kill` the first worker's impossible pid and print "Exception
  ignored ... ProcessLookupError"; `shutdown_workers` detaches it first.
  """
  code = textwrap.dedent(f'''
      import gc, sys
      sys.path.insert(0, {ROOT!r})
      import tensorflow as tf
      import tensorflow_federated as tff
      from tff_adaptive.execution import runtime
      @tff.tensorflow.computation(tf.int32)
      def add_one(x):
        return x + 1
      for _ in range(2):
        runtime.use_local_cpp_context()
        assert add_one(1) == 2
        runtime.shutdown_workers()
      gc.collect()
      print('done', flush=True)
  ''')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  assert result.returncode == 0 and 'done' in result.stdout, result.stderr[-3000:]
  assert 'Exception ignored' not in result.stderr, result.stderr[-3000:]
  assert 'ProcessLookupError' not in result.stderr, result.stderr[-3000:]


def test_a_context_used_again_after_shutdown_starts_a_new_worker():
  """A later run in the same process that keeps the context (seen: bin/train's MTFL run after
  another in-process run) finds its stopped worker's stub gone and starts a new worker, where
  TFF's ServiceManager would signal the stopped worker (AttributeError on its cleared process)."""
  code = textwrap.dedent(f'''
      import sys
      sys.path.insert(0, {ROOT!r})
      import tensorflow as tf
      import tensorflow_federated as tff
      from tff_adaptive.execution import runtime
      @tff.tensorflow.computation(tf.int32)
      def add_one(x):
        return x + 1
      runtime.use_local_cpp_context()
      assert add_one(1) == 2
      runtime.shutdown_workers()
      assert add_one(2) == 3
      print('WORKERS', ' '.join(map(str, runtime.live_workers())), flush=True)
      runtime.shutdown_workers()
  ''')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  assert result.returncode == 0, result.stderr[-3000:]
  line = next(l for l in result.stdout.splitlines() if l.startswith('WORKERS'))
  pids = [int(p) for p in line.split()[1:]]
  assert pids, 'the second call started no tracked worker'
  assert processes.gone(pids), f'worker(s) {pids} still running after shutdown_workers'
