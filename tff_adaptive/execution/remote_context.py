"""Remote TFF execution contexts on `worker_binary`s on other machines.

TFF's executor service (`tensorflow_federated/data/worker_binary`, the C++
runtime behind the local context) is the distributed engine; this is the thin
layer around it that a training run needs:

  * `worker_process.check_reachable` first fails fast, naming the address,
    when a worker does not answer.
  * `create_workers_context` builds one remote async execution context per
    worker and combines them with `tff.backends.native.create_mergeable_comp_
    execution_context`, so each round's clients are split across the workers.
    TFF's RemoteExecutor blocks its event loop in Compute; ours waits in a
    thread, so the workers' subrounds overlap instead of running in turn.
  * Faults: TFF's async context retries UNAVAILABLE forever (with back-off up
    to 30 s), so a dead worker would hang the run. Our stub turns every gRPC
    error into a `WorkerError` naming the worker instead; with `retry=True`
    the round is re-run on the remaining workers.

The mergeable context returns per-client results in subround order only with
`tff_patches.keep_subround_order_of_client_results`, which
`create_workers_context` applies.
"""

import asyncio
import sys
from collections.abc import Sequence

from absl import logging
import grpc
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.python.core.backends.native import compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.context_stack import context_base
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
from tensorflow_federated.python.core.impl.executors import value_serialization
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import placements

from tff_adaptive.execution import tff_patches
from tff_adaptive.execution import worker_process

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


def _failing_fast(method_name: str):
  """The stub's `method_name`, raising `WorkerLostError`/`WorkerComputationError` on gRPC errors."""

  def call(self, request):
    return self._call(getattr(remote_executor_grpc_stub.RemoteExecutorGrpcStub, method_name),
                      request)

  call.__name__ = method_name
  return call


def _best_effort(method_name: str):
  """The stub's `method_name`, logging instead of raising (disposal).

  Disposal frees memory on the worker; a dead worker has none to free, and
  these run from garbage-collection finalizers where raising only prints.
  ValueError: the channel was closed after a failure (`WorkersContext.close`).
  """

  def call(self, request):
    try:
      return getattr(remote_executor_grpc_stub.RemoteExecutorGrpcStub, method_name)(self, request)
    except (grpc.RpcError, ValueError) as e:
      logging.debug('%s on %s failed: %s', method_name, self.address, e)
      return None

  call.__name__ = method_name
  return call


class NamedWorkerStub(remote_executor_grpc_stub.RemoteExecutorGrpcStub):
  """A stub whose errors name the worker and are not retried.

  Raises `WorkerLostError`/`WorkerComputationError` for any gRPC error. TFF
  wraps UNAVAILABLE in a RetryableError, which its async context retries
  forever; our errors are not RetryableErrors, so the call fails at once.
  """

  def __init__(self, channel: grpc.Channel, address: str):
    super().__init__(channel)
    self.address = address

  def _call(self, method, request):
    try:
      return method(self, request)
    except grpc.RpcError as e:
      code = e.code() if isinstance(e, grpc.Call) else None
      details = ((e.details() if isinstance(e, grpc.Call) else str(e)) or '').strip()
      name = code.name if code is not None else 'error'
      if code in _LOST_CODES or code is None:
        raise worker_process.WorkerLostError(
            self.address, f'lost TFF worker {self.address} ({name}: {details})') from None
      raise worker_process.WorkerComputationError(
          self.address,
          f'computation failed on TFF worker {self.address} ({name}: {details})') from None

  get_executor = _failing_fast('get_executor')
  create_value = _failing_fast('create_value')
  create_struct = _failing_fast('create_struct')
  create_call = _failing_fast('create_call')
  create_selection = _failing_fast('create_selection')
  compute = _failing_fast('compute')
  dispose = _best_effort('dispose')
  dispose_executor = _best_effort('dispose_executor')


class ConcurrentRemoteExecutor(remote_executor.RemoteExecutor):
  """`RemoteExecutor` whose Compute RPC runs in a thread.

  TFF's RemoteExecutor makes blocking gRPC calls inside coroutines, so the
  mergeable context's subrounds would run one worker after the other. Compute
  is the call that waits for the worker's work; moved to a thread, the other
  workers' subrounds start while it waits.
  """

  async def _compute(self, value_ref, type_spec):
    if self._stream_structs and isinstance(type_spec, computation_types.StructType):
      return await super()._compute(value_ref, type_spec)
    self._check_has_executor_id()
    request = executor_pb2.ComputeRequest(executor=self._executor_id, value_ref=value_ref)
    response = await asyncio.to_thread(self._stub.compute, request)
    value, _ = value_serialization.deserialize_value(response.value, type_spec)
    return value


def _remote_context(address: str, default_num_clients: int, stream_structs: bool,
                    concurrent_compute: bool = True):
  """(async context on the worker at `address`, its gRPC channel).

  `concurrent_compute=False`: TFF's RemoteExecutor as shipped, for comparison
  (bench/workers_bench.py).
  """
  channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
  stub = NamedWorkerStub(channel, address)
  executor_cls = ConcurrentRemoteExecutor if concurrent_compute else remote_executor.RemoteExecutor

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
    tff_patches.keep_subround_order_of_client_results()
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
      except worker_process.WorkerLostError as e:
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
  worker_process.check_reachable(addresses, connect_timeout)
  return WorkersContext(addresses, retry, default_num_clients, concurrent_compute)


def set_workers_context(addresses: Sequence[str], **kwargs):
  """Installs `create_workers_context(addresses, **kwargs)` as TFF's default context."""
  context = create_workers_context(addresses, **kwargs)
  context_stack_impl.context_stack.set_default_context(context)
  return context

