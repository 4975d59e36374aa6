"""TFF's `worker_binary` as a child process (for `bin/worker` and tests).

`WorkerProcess` starts and stops one worker: its own log file (so it never
holds our stdout open), killed by the kernel if the thread that started it
dies (`parent_death`), stopped at interpreter exit, and never left running.
`parse_addresses` reads `host:port` lists and `check_reachable` fails fast,
naming the address, when a worker does not answer (a gRPC channel-ready future
with a timeout). The errors that name a worker (`WorkerError` and its kinds)
are defined here and raised by `remote_context` too.

Security: a worker executes any computation sent to it (TensorFlow graphs can
read and write files on its host), unauthenticated and unencrypted. Only the
trainer's hosts must be able to reach its port.

Imports neither TensorFlow nor TFF, so that `bin/worker` starts without them.
"""

import atexit
import importlib.util
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import grpc

from tff_adaptive import errors
from tff_adaptive.execution import parent_death
from tff_adaptive.execution import runtime
from tff_adaptive.execution import tff_patches


SECURITY_NOTE = (
    'A TFF worker executes ANY computation sent to it (TensorFlow graphs can read and write '
    'files and run code on this host), without authentication or encryption. It must only be '
    'reachable from the trainer\'s hosts: run it on a private network, firewall the port, or '
    'reach it through an SSH tunnel.')
_ADDRESS = re.compile(r'^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$')


class WorkerError(RuntimeError):
  """A TFF worker failed; `address` names it."""

  def __init__(self, address: str, message: str):
    super().__init__(message)
    self.address = address


class WorkerUnreachableError(WorkerError):
  """A worker did not answer when the run started."""


class WorkerLostError(WorkerError):
  """The connection to a worker broke mid-computation (it died or restarted)."""


class WorkerComputationError(WorkerError):
  """A worker answered, but the computation failed there."""


def worker_binary_path() -> str:
  """Path of TFF's shipped `worker_binary`, found without importing TFF."""
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError('tensorflow_federated is not installed')
  path = os.path.join(list(spec.submodule_search_locations)[0], 'data', 'worker_binary')
  if not os.access(path, os.X_OK):
    raise RuntimeError(f'TFF worker binary not found (or not executable) at {path}')
  return path


def is_ready(address: str, timeout: float) -> bool:
  """Whether a gRPC connection to `address` becomes ready within `timeout` s."""
  channel = grpc.insecure_channel(address)
  try:
    grpc.channel_ready_future(channel).result(timeout=timeout)
    return True
  except grpc.FutureTimeoutError:
    return False
  finally:
    channel.close()




def parse_addresses(spec: str) -> list[str]:
  """`'host:port,host:port'` → addresses; raises `errors.ArgumentError` naming a bad one."""
  addresses = [a.strip() for a in spec.split(',') if a.strip()]
  for address in addresses:
    match = _ADDRESS.match(address)
    if not match or not 0 < int(match.group(2)) < 65536:
      raise errors.ArgumentError('parse_addresses', None,
                                 f'{address!r} is not host:port (IPv6 as [addr]:port)')
  if len(set(addresses)) != len(addresses):
    raise errors.ArgumentError('parse_addresses', None, f'an address is listed twice: {spec}')
  return addresses



def check_reachable(addresses: Iterable[str], timeout: float = 10.0) -> None:
  """Raises `WorkerUnreachableError` naming every worker that does not answer."""
  addresses = list(addresses)
  results = {}
  # In parallel: N unreachable workers should cost one timeout, not N.
  threads = [threading.Thread(target=lambda a=a: results.__setitem__(a, is_ready(a, timeout)))
             for a in addresses]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  down = [a for a in addresses if not results.get(a)]
  if down:
    raise WorkerUnreachableError(
        down[0], f'TFF worker{"s" if len(down) > 1 else ""} {", ".join(down)} not reachable '
        f'within {timeout:g} s: start a worker listening on that port there '
        "(WorkerProcess(port=...), or the checkout's bin/worker.py) and check that the trainer "
        'can connect to the port')



_started_lock = threading.Lock()
_started: list['WorkerProcess'] = []
_atexit_registered = False


class WorkerProcess:
  """One `worker_binary` child process.

  It gets its own log file (so it never holds our stdout open), the kernel
  kills it if the thread that started it dies (PR_SET_PDEATHSIG: start it
  from a long-lived thread), and every live one is stopped at interpreter exit.
  """

  def __init__(self, port: int = 0, *, max_concurrent_computation_calls: int = 0,
               extra_args: Sequence[str] = (), log_path: Optional[str] = None,
               host: str = 'localhost'):
    """Configures (does not start) a worker.

    Args:
      port: port to serve on; 0 picks a free one.
      max_concurrent_computation_calls: the binary's flag of the same name;
        0: two per CPU core of this machine, negative: no limit
        (`runtime.resolve_concurrency`).
      extra_args: further `worker_binary` flags, passed verbatim.
      log_path: where its stdout/stderr go; None: a file in this process's
        private log directory (`runtime.private_log_dir`, removed at exit);
        '-': inherit ours (for a foreground `bin/worker`).
      host: how this process reaches it (the binary listens on all
        interfaces).
    """
    if not port:
      import portpicker  # pylint: disable=g-import-not-at-top
      port = portpicker.pick_unused_port()
    self.port = int(port)
    self.host = host
    self._args = [worker_binary_path(), f'--port={self.port}',
                  '--max_concurrent_computation_calls='
                  f'{runtime.resolve_concurrency(max_concurrent_computation_calls)}',
                  *extra_args]
    # Default: this process's private log directory, removed at exit (never a
    # fixed, predictable name in /tmp).
    self.log_path = log_path if log_path is not None else os.path.join(
        runtime.private_log_dir(), f'worker_{self.port}.log')
    self._proc: Optional[subprocess.Popen] = None

  @property
  def address(self) -> str:
    return f'{self.host}:{self.port}'

  @property
  def pid(self) -> Optional[int]:
    return self._proc.pid if self._proc is not None else None

  @property
  def args(self) -> list[str]:
    return list(self._args)

  def poll(self) -> Optional[int]:
    """None while running, else the exit status."""
    return self._proc.poll() if self._proc is not None else 0

  def start(self, wait: bool = True, timeout: float = 30.0) -> 'WorkerProcess':
    """Starts the binary; with `wait`, returns once it accepts connections."""
    if self._proc is not None and self._proc.poll() is None:
      return self
    _register_atexit()
    kwargs: dict[str, Any] = {'stdin': subprocess.DEVNULL}
    log = None
    if self.log_path != '-':
      log = open(self.log_path, 'ab')  # pylint: disable=consider-using-with
      kwargs.update(stdout=log, stderr=subprocess.STDOUT)
    args, kwargs['preexec_fn'] = parent_death.popen_args(self._args, signal.SIGKILL)
    try:
      self._proc = subprocess.Popen(args, **kwargs)  # pylint: disable=consider-using-with
    finally:
      if log is not None:
        log.close()
    with _started_lock:
      _started.append(self)
    if wait:
      self.wait_until_ready(timeout)
    return self

  def wait_until_ready(self, timeout: float = 30.0) -> None:
    """Blocks until the worker accepts connections; raises if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if self.poll() is not None:
        raise WorkerUnreachableError(
            self.address, f'TFF worker on port {self.port} exited with status {self.poll()} '
            f'before it was ready (port in use?); see {self.log_path}')
      if is_ready(self.address, min(1.0, max(0.05, deadline - time.monotonic()))):
        return
    self.stop()
    raise WorkerUnreachableError(
        self.address, f'TFF worker on port {self.port} not ready within {timeout:g} s; '
        f'see {self.log_path}')

  def stop(self, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `timeout` s; waits so no zombie remains.

    SIGTERM, not SIGINT: a process started in the background by a
    non-interactive shell ignores SIGINT, and its children inherit that.
    """
    proc = self._proc
    if proc is None:
      return
    tff_patches.stop_process(proc, signal.SIGTERM, timeout)
    with _started_lock:
      if self in _started:
        _started.remove(self)

  def kill(self) -> None:
    """SIGKILL, as a crash would (tests of fault handling)."""
    if self._proc is not None and self._proc.poll() is None:
      self._proc.kill()
      self._proc.wait()

  def __enter__(self) -> 'WorkerProcess':
    return self.start()

  def __exit__(self, *exc_info) -> None:
    self.stop()


def start_local_workers(num: int, **kwargs) -> list[WorkerProcess]:
  """Starts `num` workers on free loopback ports and waits until all are ready."""
  workers = [WorkerProcess(**kwargs).start(wait=False) for _ in range(num)]
  try:
    for worker in workers:
      worker.wait_until_ready()
  except BaseException:
    stop_workers(workers)
    raise
  return workers


def stop_workers(workers: Optional[Iterable[WorkerProcess]] = None) -> None:
  """Stops the given workers (default: every one this process started)."""
  if workers is None:
    with _started_lock:
      workers = list(_started)
  for worker in workers:
    worker.stop()


def _register_atexit() -> None:
  global _atexit_registered
  with _started_lock:
    if not _atexit_registered:
      atexit.register(stop_workers)
      _atexit_registered = True

