"""Multi-machine execution on TFF's own gRPC workers.

TFF's executor service (`tensorflow_federated/data/worker_binary`, the C++
runtime behind the local context) is the distributed engine. This module is the
thin layer around it that a training run needs:

  * `WorkerProcess` starts and stops a `worker_binary` (for `bin/worker` and
    tests): own log file, killed by the kernel if its parent dies
    (PR_SET_PDEATHSIG), stopped at interpreter exit, and never left running.
  * `check_reachable` fails fast, naming the address, when a worker does not
    answer (a gRPC channel-ready future with a timeout).
  * `create_workers_context` builds one remote async execution context per
    worker and combines them with `tff.backends.native.create_mergeable_comp_
    execution_context`, so each round's clients are split across the workers.
    TFF's RemoteExecutor blocks its event loop in Compute; ours waits in a
    thread, so the workers' subrounds overlap instead of running in turn.
  * Faults: TFF's async context retries UNAVAILABLE forever (with back-off up
    to 30 s), so a dead worker would hang the run. Our stub turns every gRPC
    error into a `WorkerError` naming the worker instead; with `retry=True`
    the round is re-run on the remaining workers.
  * `compose_data_on_workers` makes workers build client datasets from client
    ids (`tff.simulation.compose_dataset_computation_with_learning_process`).

Security: a worker executes any computation sent to it (TensorFlow graphs can
read and write files on its host), unauthenticated and unencrypted. Only the
trainer's hosts must be able to reach its port.

TFF is imported lazily so that `bin/worker` starts without TensorFlow.
"""

import asyncio
import atexit
import functools
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from absl import logging
import grpc

from tff_adaptive.execution import parent_death
from tff_adaptive.execution import runtime


SECURITY_NOTE = (
    'A TFF worker executes ANY computation sent to it (TensorFlow graphs can read and write '
    'files and run code on this host), without authentication or encryption. It must only be '
    'reachable from the trainer\'s hosts: run it on a private network, firewall the port, or '
    'reach it through an SSH tunnel.')

# As TFF's local context: messages carry whole models and datasets.
_GRPC_MAX_MESSAGE_LENGTH_BYTES = 2 * 1000 * 1000 * 1000
_CHANNEL_OPTIONS = (
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_LENGTH_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_LENGTH_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_LENGTH_BYTES),
)
# gRPC codes that mean the worker (or the way to it) is gone, rather than that
# the computation itself failed: another worker can run the same subround.
# FAILED_PRECONDITION is what a restarted worker answers for executor ids it
# no longer knows.
_LOST_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED})
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


def parse_addresses(spec: str) -> list[str]:
  """`'host:port,host:port'` → addresses; raises ValueError naming a bad one."""
  addresses = [a.strip() for a in spec.split(',') if a.strip()]
  for address in addresses:
    match = _ADDRESS.match(address)
    if not match or not 0 < int(match.group(2)) < 65536:
      raise ValueError(f'--workers: {address!r} is not host:port (IPv6 as [addr]:port)')
  if len(set(addresses)) != len(addresses):
    raise ValueError(f'--workers lists an address twice: {spec}')
  return addresses


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
        f'within {timeout:g} s: start it with `bin/worker.py --port=PORT` on that host and check '
        f'that the trainer can connect to the port')


# ---------------------------------------------------------------------------
# Local worker processes.

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
    kwargs['preexec_fn'] = parent_death.preexec_fn(signal.SIGKILL)
    try:
      self._proc = subprocess.Popen(self._args, **kwargs)  # pylint: disable=consider-using-with
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
    if proc.poll() is None:
      try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
      except ProcessLookupError:
        pass
      except subprocess.TimeoutExpired:
        proc.kill()
    proc.wait()
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


# ---------------------------------------------------------------------------
# Remote execution contexts.


def _stub_class():
  """`RemoteExecutorGrpcStub` whose errors name the worker and are not retried."""
  from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub  # pylint: disable=g-import-not-at-top

  class NamedWorkerStub(remote_executor_grpc_stub.RemoteExecutorGrpcStub):
    """Raises `WorkerLostError`/`WorkerComputationError` for any gRPC error.

    TFF wraps UNAVAILABLE in a RetryableError, which its async context retries
    forever; our errors are not RetryableErrors, so the call fails at once.
    """

    def __init__(self, channel: grpc.Channel, address: str):
      super().__init__(channel)
      self.address = address

    def _call(self, method, request):
      try:
        return method(request)
      except grpc.RpcError as e:
        code = e.code() if isinstance(e, grpc.Call) else None
        details = (e.details() if isinstance(e, grpc.Call) else str(e)) or ''
        name = code.name if code is not None else 'error'
        if code in _LOST_CODES or code is None:
          raise WorkerLostError(
              self.address, f'lost TFF worker {self.address} ({name}: {details.strip()})') from None
        raise WorkerComputationError(
            self.address,
            f'computation failed on TFF worker {self.address} ({name}: {details.strip()})') from None

    def get_executor(self, request):
      return self._call(super().get_executor, request)

    def create_value(self, request):
      return self._call(super().create_value, request)

    def create_struct(self, request):
      return self._call(super().create_struct, request)

    def create_call(self, request):
      return self._call(super().create_call, request)

    def create_selection(self, request):
      return self._call(super().create_selection, request)

    def compute(self, request):
      return self._call(super().compute, request)

    # Disposal frees memory on the worker; a dead worker has none to free, and
    # these run from garbage-collection finalizers where raising only prints.
    # ValueError: the channel was closed after a failure (`WorkersContext.close`).
    def dispose(self, request):
      try:
        return super().dispose(request)
      except (grpc.RpcError, ValueError) as e:
        logging.debug('dispose on %s failed: %s', self.address, e)
        return None

    def dispose_executor(self, request):
      try:
        return super().dispose_executor(request)
      except (grpc.RpcError, ValueError) as e:
        logging.debug('dispose_executor on %s failed: %s', self.address, e)
        return None

  return NamedWorkerStub


def _executor_class(concurrent_compute: bool = True):
  """`RemoteExecutor` whose Compute RPC runs in a thread.

  TFF's RemoteExecutor makes blocking gRPC calls inside coroutines, so the
  mergeable context's subrounds would run one worker after the other. Compute
  is the call that waits for the worker's work; moved to a thread, the other
  workers' subrounds start while it waits.
  """
  from tensorflow_federated.proto.v0 import executor_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import remote_executor  # pylint: disable=g-import-not-at-top
  if not concurrent_compute:  # TFF's as shipped, for comparison (bench/workers_bench.py)
    return remote_executor.RemoteExecutor
  from tensorflow_federated.python.core.impl.executors import value_serialization  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import computation_types  # pylint: disable=g-import-not-at-top

  class ConcurrentRemoteExecutor(remote_executor.RemoteExecutor):

    async def _compute(self, value_ref, type_spec):
      if self._stream_structs and isinstance(type_spec, computation_types.StructType):
        return await super()._compute(value_ref, type_spec)
      self._check_has_executor_id()
      request = executor_pb2.ComputeRequest(executor=self._executor_id, value_ref=value_ref)
      response = await asyncio.to_thread(self._stub.compute, request)
      value, _ = value_serialization.deserialize_value(response.value, type_spec)
      return value

  return ConcurrentRemoteExecutor


def _remote_context(address: str, default_num_clients: int, stream_structs: bool,
                    concurrent_compute: bool = True):
  """(async context on the worker at `address`, its gRPC channel)."""
  from tensorflow_federated.python.core.backends.native import compiler  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import placements  # pylint: disable=g-import-not-at-top

  channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
  stub = _stub_class()(channel, address)
  executor_cls = _executor_class(concurrent_compute)

  def stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = default_num_clients
    executor = executor_cls(stub, stream_structs=stream_structs)
    executor.set_cardinalities(cardinalities)
    return executor

  context = async_execution_context.AsyncExecutionContext(
      executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(stack_fn),
      compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)
  return context, channel


def create_remote_context(address: str, *, default_num_clients: int = 0,
                          stream_structs: bool = False):
  """A TFF async execution context running computations on the worker at `address`.

  The same stack as TFF's local C++ context (`local_cpp_executor_factory`),
  pointed at a remote worker instead of a child process, with errors that name
  the worker and are not retried (see `WorkerError`).

  Args:
    address: `host:port` of a running worker.
    default_num_clients: clients cardinality for computations without client
      arguments (the remote stack needs one; as TFF's local context, 0).
    stream_structs: TFF's option to send struct values element by element.
  """
  return _remote_context(address, default_num_clients, stream_structs)[0]


@functools.cache
def _workers_context_class():
  """The context classes, defined on first use so that TFF is imported lazily."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_base  # pylint: disable=g-import-not-at-top

  class _Attempt:
    """One invocation of a computation across the workers."""

    def __init__(self):
      self.failed = False

  class _WorkerContext(context_base.AsyncContext):
    """A worker's async context, reporting only the first failure of an attempt.

    TFF's mergeable context raises the first failed subround and abandons the
    others; a second failure (the other workers' calls end when we close their
    channels) would otherwise surface as "Task exception was never retrieved"
    with a traceback at exit.
    """

    def __init__(self, inner, attempt: _Attempt):
      self._inner = inner
      self._attempt = attempt

    async def invoke(self, comp, arg):
      try:
        return await self._inner.invoke(comp, arg)
      except Exception:  # pylint: disable=broad-except
        if self._attempt.failed:
          return None  # Nobody reads it: the attempt already failed.
        self._attempt.failed = True
        raise

  class WorkersContext(context_base.SyncContext):
    """Delegates to a mergeable context over the workers.

    After a failure the mergeable context is dropped (its channels closed, so
    calls still running on the other workers end) and rebuilt on the next
    invocation: without the lost worker if `retry`, else with all workers
    (which lets a caller retry once the worker is back).
    """

    def __init__(self, addresses: Sequence[str], retry: bool, default_num_clients: int,
                 concurrent_compute: bool):
      self.addresses = list(addresses)
      self.lost: list[str] = []
      self._retry = retry
      self._default_num_clients = default_num_clients
      self._concurrent_compute = concurrent_compute
      self._mergeable = None
      self._attempt = _Attempt()
      self._channels = []

    def _build(self):
      # Kept across invocations: each context caches its compiled computations.
      self._attempt = _Attempt()
      contexts = []
      for address in self.addresses:
        context, channel = _remote_context(address, self._default_num_clients, False,
                                           self._concurrent_compute)
        contexts.append(_WorkerContext(context, self._attempt))
        self._channels.append(channel)
      _keep_subround_order_of_client_results()
      self._mergeable = tff.backends.native.create_mergeable_comp_execution_context(contexts)

    def close(self):
      """Drops the mergeable context and closes its channels."""
      self._mergeable = None
      channels, self._channels = self._channels, []
      for channel in channels:
        channel.close()

    def invoke(self, comp, arg):
      while True:
        if self._mergeable is None:
          self._build()
        self._attempt.failed = False
        try:
          return self._mergeable.invoke(comp, arg)
        except WorkerLostError as e:
          self.close()
          if not self._retry or len(self.addresses) <= 1 or e.address not in self.addresses:
            raise
          self.addresses.remove(e.address)
          self.lost.append(e.address)
          logging.warning('%s; re-running on the %d remaining worker(s): %s', e,
                          len(self.addresses), ', '.join(self.addresses))
          print(f'warning: {e}; re-running on {", ".join(self.addresses)}', file=sys.stderr,
                flush=True)
        except BaseException:
          self.close()
          raise

  return WorkersContext


def create_workers_context(addresses: Sequence[str], *, retry: bool = False,
                           connect_timeout: float = 10.0, default_num_clients: int = 0,
                           concurrent_compute: bool = True):
  """A sync TFF context splitting each computation's clients across `addresses`.

  One remote async context per worker, combined by TFF's mergeable-comp
  context: a round's clients are split into len(addresses) contiguous parts,
  each worker trains its part and pre-aggregates, and the partial aggregates
  are merged. With `retry`, a computation that loses a worker is re-run on the
  remaining ones (computations are pure functions of their arguments, so a
  re-run is exact up to float summation order).

  Args:
    addresses: `host:port` of each worker.
    retry: re-run a computation on the remaining workers when one is lost.
    connect_timeout: seconds each worker has to answer at start.
    default_num_clients: clients cardinality for computations without client
      arguments.
    concurrent_compute: wait for each worker's Compute call in a thread so the
      workers' subrounds overlap; False: TFF's RemoteExecutor as shipped, whose
      blocking call runs them one after the other (kept for measurement).

  Raises:
    WorkerUnreachableError: naming the workers that do not answer.
  """
  addresses = list(addresses)
  if not addresses:
    raise ValueError('no worker addresses')
  check_reachable(addresses, connect_timeout)
  return _workers_context_class()(addresses, retry, default_num_clients, concurrent_compute)


def set_workers_context(addresses: Sequence[str], **kwargs):
  """Installs `create_workers_context(addresses, **kwargs)` as TFF's default context."""
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top
  context = create_workers_context(addresses, **kwargs)
  context_stack_impl.context_stack.set_default_context(context)
  return context


# ---------------------------------------------------------------------------
# Data on workers.


def _keep_subround_order_of_client_results() -> None:
  """Makes TFF's mergeable context return `CLIENTS`-placed results in client order.

  TFF 0.87's `_invoke_after_merge_in_async_pool` collects the subrounds'
  results in the order the workers *finish* (`asyncio.wait(FIRST_COMPLETED)`)
  and concatenates them, so a per-client output comes back permuted whenever a
  later subround finishes first (observed: MTFL's private patches were
  stored for the wrong clients with 5 clients on 2 workers). Aggregates are
  unaffected (sums commute); per-client outputs are not. This replacement
  runs subround i on context i mod n and keeps subround order.
  """
  from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context as mcec  # pylint: disable=g-import-not-at-top
  if getattr(mcec._invoke_after_merge_in_async_pool, '_tff_adaptive_ordered', False):  # pylint: disable=protected-access
    return

  async def ordered(comp, merge_result, arg_list, execution_contexts):
    results = []
    n = len(execution_contexts)
    for start in range(0, len(arg_list), n):
      results += await asyncio.gather(*[
          mcec._compute_after_merged(comp, arg, merge_result, context)  # pylint: disable=protected-access
          for arg, context in zip(arg_list[start:start + n], execution_contexts)])
    return results

  ordered._tff_adaptive_ordered = True  # pylint: disable=protected-access
  mcec._invoke_after_merge_in_async_pool = ordered  # pylint: disable=protected-access


def has_round_hparams(process) -> bool:
  """Whether `process` runs K local steps itself (`local_steps` in its state's client_work)."""
  from tff_adaptive.algorithms import composer  # pylint: disable=g-import-not-at-top
  return composer.runs_local_steps(process.initialize.type_signature.result)


def compose_data_on_workers(process, task, local_steps: Optional[int] = None):
  """`process` taking client ids: workers build each client's dataset.

  The dataset computation is the task's `serializable_dataset_fn` followed by
  its training preprocessing (and, for processes that do not run K steps
  themselves, `repeat().take(K)` as `program.client_datasets` does), so the
  data is identical to what the trainer would have sent. Workers need the
  data: file-based tasks read their files on the worker at the same path;
  in-memory tasks embed the arrays in the computation.

  Args:
    process: a `LearningProcess` whose `next` takes one federated dataset.
    task: a `tasks.base.FederatedTask`.
    local_steps: K, applied to the data unless the process runs K itself.

  Returns:
    (the composed `LearningProcess`, the K baked into the data or None).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  train_data = task.train_data
  dataset_fn = getattr(train_data, 'serializable_dataset_fn', None)
  if dataset_fn is None:
    raise ValueError(f'--data_on_workers: task {task.name} has no serializable dataset function')
  data_steps = None if has_round_hparams(process) else (local_steps or None)
  # Seeded shuffles built eagerly in the trainer mix in the global seed
  # (`tf.random.set_seed`); graphs built for TFF have their own, unset seed.
  # Carry the trainer's over so both build the same shuffles.
  from tensorflow.python.eager import context as eager_context  # pylint: disable=g-import-not-at-top
  global_seed = eager_context.global_seed()

  @tff.tensorflow.computation(tf.string)
  def build_client_dataset(client_id):
    if global_seed is not None:
      tf.random.set_seed(global_seed)
    dataset = task.preprocess_train(dataset_fn(client_id))
    if data_steps is not None:
      dataset = dataset.repeat().take(data_steps)
    return dataset

  composed = tff.simulation.compose_dataset_computation_with_learning_process(
      build_client_dataset, process)
  return composed, data_steps


def client_ids_fn(data_steps: Optional[int]):
  """`program.run`'s `client_data_fn` for a process from `compose_data_on_workers`."""

  def client_data(client_ids: list[str], steps: Optional[int]) -> list[str]:
    if steps != data_steps:
      raise ValueError(f'data on workers was built for {data_steps} local steps, the loop asks '
                       f'for {steps}')
    return list(client_ids)

  return client_data
