"""TFF execution contexts whose `worker_binary` children never outlive us.

TFF 0.87's local C++ context starts `tensorflow_federated/data/worker_binary`
with `subprocess.Popen(..., stdout=sys.stdout)` and only stops it from a
`__del__`, which does not run at interpreter exit, on SIGTERM or when the
parent is killed. Observed: the worker outlived its parent in 4 of 4 runs, and
because it inherits stdout, a pipe reading our output never closes.

Nothing here happens at import. `track_tff_workers()` (called by
`use_local_cpp_context()`, by the binaries and by the training loop; library
users call it, or `use_local_cpp_context()`, once at the start of their
program) routes TFF's worker launch through `_TrackedPopen`, which
  * gives the worker its own stdout/stderr log file (pipes close with us) in
    `set_worker_log_dir()`'s directory, or else in a private temporary
    directory that is removed at exit,
  * asks the kernel to SIGKILL the worker if this process dies
    (PR_SET_PDEATHSIG, covers `kill -9` of the trainer),
  * records the process so `shutdown_workers()` can stop it at normal exit,
    on exceptions (atexit) and on SIGINT/SIGTERM (converted to exceptions so
    that the atexit path runs).
The TFF attributes this replaces are listed, with the TFF version they were
written for, in `tff_patches`.
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Optional

from tff_adaptive import errors
from tff_adaptive.execution import parent_death
from tff_adaptive.execution import tff_patches

_lock = threading.Lock()
_children: list[subprocess.Popen] = []
_installed = False
_tracking = False


_log_dir: Optional[str] = None  # set_worker_log_dir()
_private_log_dir: Optional[str] = None  # mkdtemp'd on first use, removed at exit


def set_worker_log_dir(path: Optional[str]) -> None:
  """Worker logs go to `path` (e.g. a run directory); None: a private temp dir."""
  global _log_dir
  _log_dir = path


def private_log_dir() -> str:
  """This process's private log directory (mode 0700, unpredictable name), removed at exit.

  Fixed names in /tmp can be planted or pile up (one per process).
  """
  global _private_log_dir
  with _lock:
    if _private_log_dir is None:
      _private_log_dir = tempfile.mkdtemp(prefix='tff_adaptive_')
      atexit.register(_remove_private_log_dir)
    return _private_log_dir


def worker_log_path() -> str:
  """The log file of the workers this process starts (not created here)."""
  if _log_dir is not None:
    return os.path.join(_log_dir, 'worker.log')
  return os.path.join(private_log_dir(), 'worker.log')


def _remove_private_log_dir() -> None:
  global _private_log_dir
  shutdown_workers()  # their open log must be closed before the directory goes
  if _private_log_dir is not None:
    shutil.rmtree(_private_log_dir, ignore_errors=True)
    _private_log_dir = None


# Above any Linux pid_max (2**22): os.kill of it fails with ESRCH.
_NO_SUCH_PID = 2**31 - 1


class _TrackedPopen(subprocess.Popen):
  """Popen for TFF's worker: own log file, dies with us, recorded for cleanup.

  Once the worker has been reaped its `pid` reads as a pid that cannot exist:
  TFF's ServiceManager.__del__ sends SIGINT to `self._process.pid` whenever a
  context is dropped, long after the worker may have exited, and a reused pid
  can by then be any process, or a thread of this one (thread ids share the
  pid space): a pytest worker was observed to receive that KeyboardInterrupt.
  """

  @property
  def pid(self):
    return self._worker_pid if self.returncode is None else _NO_SUCH_PID

  @pid.setter
  def pid(self, value):
    self._worker_pid = value

  def __init__(self, args, **kwargs):
    log = open(worker_log_path(), 'ab')  # pylint: disable=consider-using-with
    kwargs['stdout'] = log
    kwargs['stderr'] = subprocess.STDOUT
    kwargs['stdin'] = subprocess.DEVNULL
    # SIGINT at its default: TFF stops this worker with SIGINT and waits.
    args, kwargs['preexec_fn'] = parent_death.popen_args(args, signal.SIGKILL,
                                                         default_sigint=True)
    super().__init__(args, **kwargs)
    log.close()
    with _lock:
      _children.append(self)


def live_workers() -> list[int]:
  """PIDs of worker processes started by this process that are still running."""
  with _lock:
    return [p.pid for p in _children if p.poll() is None]


def shutdown_workers(timeout: float = 5.0) -> None:
  """Stops every worker this process started: SIGINT, then SIGKILL."""
  with _lock:
    children = list(_children)
    _children.clear()
  for proc in children:
    if proc.poll() is None:
      try:
        proc.send_signal(signal.SIGINT)
      except ProcessLookupError:
        continue
  for proc in children:
    try:
      proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
  if children:
    tff_patches.forget_stopped_workers(children)


def _raise_on_sigterm(signum, frame):
  del frame
  raise SystemExit(128 + signum)


def track_tff_workers(fast_serialization: bool = True) -> None:
  """Every worker_binary TFF starts from now on is tracked (see module doc).

  Covers TFF's own default context too (a program that runs our processes
  without calling `use_local_cpp_context`): its workers get a log file, die
  with this process and are stopped at exit. Changes no signal handler.
  Process-wide and idempotent: it patches TFF's executor factory (its
  `subprocess`), so it is never done at import, only when a program asks.

  Args:
    fast_serialization: also have TFF serialise nested values in place
      (`tff_patches.use_in_place_serialization`; the default for our binaries,
      values are identical to TFF's).
  """
  global _tracking
  if fast_serialization:
    tff_patches.use_in_place_serialization()
  if _tracking:
    return
  tff_patches.route_worker_launch(_TrackedPopen)
  atexit.register(shutdown_workers)
  shut_down_tff_at_exit()
  _tracking = True


_EXECUTOR_FACTORY = 'tensorflow_federated.python.core.impl.executor_stacks.executor_factory'
_shutting_down_at_exit = False


def shut_down_tff_at_exit() -> None:
  """At interpreter exit, TFF's executor services stop before Python tears itself down.

  TFF's local context keeps its `worker_binary` in a ServiceManager whose
  `__del__` only runs at teardown, when the modules it needs are gone: every
  program that imported TFF (even only to build a computation, or through a
  module it imports) then ends with "Exception ignored in ...
  ServiceManager.__del__ ... 'NoneType' object has no attribute 'Popen'".
  Registered here, an exit handler stops every ServiceManager's worker and
  disarms that `__del__` (`tff_patches.disarm_service_managers`). It imports
  nothing: a program that never imported TFF does nothing at exit. Called by
  `track_tff_workers` (so by `use_local_cpp_context`) and by every binary;
  idempotent.
  """
  global _shutting_down_at_exit
  with _lock:
    if _shutting_down_at_exit:
      return
    _shutting_down_at_exit = True
  atexit.register(_shut_down_tff)


def _shut_down_tff() -> None:
  if _EXECUTOR_FACTORY in sys.modules:  # TFF was imported: its services may be running
    shutdown_workers()
    tff_patches.disarm_service_managers()


def _install_process_hooks() -> None:
  global _installed
  if _installed:
    return
  track_tff_workers()
  if threading.current_thread() is threading.main_thread():
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
      signal.signal(signal.SIGTERM, _raise_on_sigterm)
  _installed = True


# Clients computed at once per CPU core by default. TFF's default (no limit)
# starts every client of a round together: on the EMNIST CNN, 10 clients on 2
# cores left the cores idle for a third of the round and made round times
# vary 2x between rounds; 2 per core was the fastest of 1, 2 and unlimited on
# the CNN and on the digits MLP with 50 clients (docs/performance.md).
CONCURRENT_CLIENTS_PER_CORE = 2


def usable_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


def resolve_concurrency(max_concurrent_computation_calls: Optional[int]) -> int:
  """0 or None: the default (2 per usable core); negative: unlimited (-1)."""
  if not max_concurrent_computation_calls:
    return CONCURRENT_CLIENTS_PER_CORE * usable_cores()
  return max(int(max_concurrent_computation_calls), -1)


def set_intra_op_threads(threads: Optional[int]) -> bool:
  """TensorFlow's intra-op threads (the threads one op is split over); None or
  0: TensorFlow's default. Whether TensorFlow runs with them: they can be
  set only before it runs its first op (False: it already ran with others).

  One thread suits recurrent models whose cohort runs with the lane axis on
  the weights (tff_adaptive/rounds/lanes.py): their step is thousands of
  small ops in independent chains, which TensorFlow's inter-op threads run
  side by side, while splitting each small op over threads costs more than
  it gains (docs/performance.md). ValueError naming `threads` if negative.
  """
  if threads is not None and threads < 0:
    raise errors.ArgumentError('set_intra_op_threads', 'threads',
                               'must be 0 (the default) or positive', value=threads)
  if not threads:
    return True
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if tf.config.threading.get_intra_op_parallelism_threads() == threads:
    return True
  try:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
  except RuntimeError:  # TensorFlow's context is initialised
    return False
  # Also read when TensorFlow makes its thread pools: with the context's
  # setting alone the Shakespeare GRU round took 0.75 s, with both 0.60 s.
  os.environ['TF_NUM_INTRAOP_THREADS'] = str(threads)
  return True


def use_local_cpp_context(max_concurrent_computation_calls: Optional[int] = 0,
                          default_num_clients: int = 0, secure_intrinsics: bool = False) -> None:
  """Sets TFF's synchronous local C++ context with a tracked worker.

  Args:
    max_concurrent_computation_calls: concurrency limit of the C++ runtime
      (clients trained in parallel); 0 or None: `CONCURRENT_CLIENTS_PER_CORE`
      per usable core; negative: unlimited (TFF's default).
    default_num_clients: clients cardinality for computations with no client
      arguments.
    secure_intrinsics: whether computations use secure aggregation
      (`tff.learning.secure_aggregator`); the native context cannot run its
      `federated_secure_sum_bitwidth`, TFF's test context (the same C++
      runtime) compiles it to the plain sums a simulation needs.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  _install_process_hooks()
  setter = (tff.backends.test.set_sync_test_cpp_execution_context if secure_intrinsics
            else tff.backends.native.set_sync_local_cpp_execution_context)
  setter(
      default_num_clients=default_num_clients,
      max_concurrent_computation_calls=resolve_concurrency(max_concurrent_computation_calls))


def use_local_cpp_program_context(max_concurrent_computation_calls: Optional[int] = 0,
                                  default_num_clients: int = 0) -> None:
  """Sets TFF's local C++ context for `tff.program` code, with a tracked worker.

  `tff.learning.programs.train_model` and other `tff.program` logic need a
  `tff.program.FederatedContext` (TFF's async C++ context wrapped in
  `tff.program.NativeFederatedContext`); under it, computations return value
  references instead of values, so plain `process.next(...)` loops use
  `use_local_cpp_context()` instead. Arguments as there.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top
  _install_process_hooks()
  context = tff.backends.native.create_async_local_cpp_execution_context(
      default_num_clients=default_num_clients,
      max_concurrent_computation_calls=resolve_concurrency(max_concurrent_computation_calls))
  context_stack_impl.context_stack.set_default_context(tff.program.NativeFederatedContext(context))


def find_worker_processes(parent_pid: Optional[int] = None) -> list[int]:
  """PIDs of running `worker_binary` processes (children of `parent_pid` if set)."""
  pids = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        cmd = f.read()
      if b'worker_binary' not in cmd:
        continue
      if parent_pid is not None:
        with open(f'/proc/{entry}/stat') as f:
          ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        if ppid != parent_pid:
          continue
      pids.append(int(entry))
    except (OSError, ValueError, IndexError):
      continue
  return pids
