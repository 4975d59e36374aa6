"""Every patch of TFF internals that tff_adaptive applies, and the TFF version it targets.

`PATCHES` lists them: the attribute of TFF that is replaced, the function here
that replaces it, and why. They were written against TFF `TFF_VERSION` (its
private modules and attributes carry no compatibility promise): a different
installed TFF logs one warning when a patch is applied, and
tests/test_tff_patches.py checks that every target exists and that the
replacements are still needed where that can be observed.

Nothing is patched at import. The functions below are called by
`runtime.track_tff_workers` / `runtime.use_local_cpp_context` (the worker
launch, in-place serialisation, ServiceManager teardown) and by
`remote_context.create_workers_context` (the mergeable context's order).

Besides these patches the package subclasses TFF classes and overrides their
private methods (`remote_context.NamedWorkerStub`,
`remote_context.ConcurrentRemoteExecutor._compute`) and builds optimisers on
TFF's private optimizer modules (`optimizers/`): those break loudly (an
AttributeError or ImportError) rather than silently when TFF changes.
"""

import asyncio
import contextlib
import dataclasses
import functools
import gc
import signal
import subprocess

from absl import logging

TFF_VERSION = '0.87.0'

_VALUE_SERIALIZATION = 'tensorflow_federated.python.core.impl.executors.value_serialization'
_EXECUTOR_FACTORY = 'tensorflow_federated.python.core.impl.executor_stacks.executor_factory'
_MERGEABLE_CONTEXT = ('tensorflow_federated.python.core.impl.execution_contexts.'
                      'mergeable_comp_execution_context')


@dataclasses.dataclass(frozen=True)
class Patch:
  """One replaced attribute of TFF.

  module: the TFF module.
  attribute: what in it is replaced ('Class.attribute' for a class's).
  applied_by: the function of this module that replaces it.
  why: what goes wrong with TFF's own.
  per_instance: set at run time on the objects (or local classes) concerned,
    found through the garbage collector, not on the module: TFF defines
    `ServiceManager` inside `local_cpp_executor_factory`, a new class per call.
  """
  module: str
  attribute: str
  applied_by: str
  why: str
  per_instance: bool = False


PATCHES = (
    Patch(_VALUE_SERIALIZATION, '_serialize_struct_type', 'use_in_place_serialization',
          'copies every tensor once per level of struct nesting (191 ms per FedGBO-Adam '
          'state); ours fills the proto in place'),
    Patch(_VALUE_SERIALIZATION, '_serialize_federated_value', 'use_in_place_serialization',
          'the same copies for federated values'),
    Patch(_EXECUTOR_FACTORY, 'subprocess', 'route_worker_launch',
          'starts worker_binary with our stdout and never stops it at exit, on SIGTERM or '
          'when the parent is killed; ours gives it a log file, kills it with its parent and '
          'records it for shutdown'),
    Patch(_EXECUTOR_FACTORY, 'local_cpp_executor_factory.ServiceManager.__del__',
          'disarm_service_managers',
          'runs at interpreter teardown, when the subprocess module is already None, and '
          'prints "Exception ignored" in every program that imported TFF', per_instance=True),
    Patch(_EXECUTOR_FACTORY, 'local_cpp_executor_factory.ServiceManager._process',
          'forget_stopped_workers',
          'its __del__ signals the pid of a worker we already stopped (ProcessLookupError, '
          'or a reused pid)', per_instance=True),
    Patch(_MERGEABLE_CONTEXT, '_invoke_after_merge_in_async_pool',
          'keep_subround_order_of_client_results',
          'returns per-client results in the order the workers finish, not client order'),
)


@functools.cache
def _check_version() -> None:
  """Logs once if the installed TFF is not the version the patches were written for."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  if tff.__version__ != TFF_VERSION:
    logging.warning('tff_adaptive patches TFF internals written for TFF %s; TFF %s is '
                    'installed (see tff_adaptive/execution/tff_patches.py)', TFF_VERSION,
                    tff.__version__)


# ---------------------------------------------------------------------------
# In-place value serialisation.

def _serialize_into(target, value, type_spec):
  """Fills the `executor_pb2.Value` `target` in place; returns the value's type.

  TFF 0.87 builds a struct's proto from its serialised elements
  (`Element(value=...)`, `federated.value.append(...)`), and protobuf copies a
  message passed that way: every tensor is copied once per level of nesting.
  A FedGBO-Adam state (x, m, v under three levels) took 191 ms to serialise for
  13.8 MiB, FedAvg's 41 ms for 4.6 MiB, on every call of `process.next`. Here
  structs and federated values are filled in place and only leaves (tensors,
  sequences, computations) go through TFF's own serialiser: one copy each.
  """
  from tensorflow_federated.python.common_libs import structure  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import value_serialization  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import computation_types  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import type_serialization  # pylint: disable=g-import-not-at-top
  if isinstance(type_spec, computation_types.StructType):
    elements = structure.from_container(value)
    if len(elements) != len(type_spec):
      raise TypeError(f'Cannot serialize a struct value of {len(elements)} elements to a struct '
                      f'type requiring {len(type_spec)} elements. Trying to serialize\n'
                      f'{value!r}\nto\n{type_spec}.')
    for (name, element_type), (_, element) in zip(structure.iter_elements(type_spec),
                                                   structure.iter_elements(elements)):
      target_element = target.struct.element.add()
      if name:
        target_element.name = name
      _serialize_into(target_element.value, element, element_type)
    target.struct.SetInParent()  # an empty struct is still a struct
    return type_spec
  if isinstance(type_spec, computation_types.FederatedType):
    members = [value] if type_spec.all_equal else value
    if not isinstance(members, list):
      raise TypeError(f'Expected a list of client values for {type_spec}; got {type(value)}')
    for member in members:
      member_type = _serialize_into(target.federated.value.add(), member, type_spec.member)
      type_spec.member.check_assignable_from(member_type)
    target.federated.type.CopyFrom(type_serialization.serialize_type(type_spec).federated)
    return type_spec
  leaf, leaf_type = value_serialization.serialize_value(value, type_spec)
  target.CopyFrom(leaf)
  return leaf_type



_SERIALIZERS = ('_serialize_struct_type', '_serialize_federated_value')
_shipped_serializers = {}


def use_in_place_serialization() -> None:
  """Replaces TFF's struct/federated serialisers by `_serialize_into` (process-wide).

  Values and protos are identical to TFF's (tested); only the copies go.
  """
  from tensorflow_federated.proto.v0 import executor_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import value_serialization  # pylint: disable=g-import-not-at-top
  _check_version()

  def serialize_in_place(value, type_spec):
    value_proto = executor_pb2.Value()
    return value_proto, _serialize_into(value_proto, value, type_spec)

  # serialize_value dispatches through these module globals at call time.
  for name in _SERIALIZERS:
    _shipped_serializers.setdefault(name, getattr(value_serialization, name))
    setattr(value_serialization, name, serialize_in_place)


@contextlib.contextmanager
def shipped_value_serialization():
  """Within the block, TFF serialises values as shipped (tests compare)."""
  from tensorflow_federated.python.core.impl.executors import value_serialization  # pylint: disable=g-import-not-at-top
  current = {name: getattr(value_serialization, name) for name in _SERIALIZERS}
  for name, fn in _shipped_serializers.items():
    setattr(value_serialization, name, fn)
  try:
    yield
  finally:
    for name, fn in current.items():
      setattr(value_serialization, name, fn)


# ---------------------------------------------------------------------------
# The local context's worker process.


def route_worker_launch(popen_class) -> None:
  """TFF's executor factory starts its `worker_binary` with `popen_class` (process-wide)."""
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top
  _check_version()

  class SubprocessShim:
    """Stands in for the `subprocess` module inside TFF's executor factory."""

    def __getattr__(self, name):
      return getattr(subprocess, name)

    Popen = popen_class

  executor_factory.subprocess = SubprocessShim()


def forget_stopped_workers(children) -> None:
  """Detaches stopped workers from the TFF ServiceManagers that started them.

  A ServiceManager's `__del__` (when its context is replaced, e.g. a second
  training run in one process) does `os.kill(process.pid, SIGINT)`; for a
  reaped worker our pid is impossible (see `_TrackedPopen`), which TFF reports
  as "Exception ignored ... ProcessLookupError". With `_process` cleared,
  `__del__` has nothing to stop. The stub goes too: a context used again
  after its worker stopped (a later run in the same process that keeps the
  context) finds no stub and starts a new worker, where TFF's `get_stub`
  would signal the stopped worker's `_process` (None: AttributeError).
  """
  stopped = {id(p) for p in children}
  for obj in gc.get_objects():
    if (type(obj).__name__ == 'ServiceManager' and
        id(getattr(obj, '_process', None)) in stopped):
      obj._process = None  # pylint: disable=protected-access
      obj._stub = None  # pylint: disable=protected-access


def disarm_service_managers() -> None:
  """Stops TFF's ServiceManagers' workers now, and their __del__ from running at teardown.

  TFF creates a ServiceManager for its default context at import; its
  `__del__` refers to the `subprocess` module global, which is already None
  when the interpreter finalises, so every program that imported TFF prints
  "Exception ignored in ... __del__ ... 'NoneType' object has no attribute
  'Popen'" at exit. Called at exit (`runtime.shut_down_tff_at_exit`): a
  worker TFF started without our tracking (a program that never called
  `runtime.track_tff_workers`) is stopped here as `__del__` would have
  (SIGINT, then SIGKILL if it lingers); ours are stopped by
  `runtime.shutdown_workers`.
  """
  for obj in gc.get_objects():
    cls = type(obj)
    if cls.__name__ == 'ServiceManager' and cls.__module__.endswith('executor_factory'):
      stop_process(getattr(obj, '_process', None))
      obj._process = None  # pylint: disable=protected-access
      cls.__del__ = lambda self: None


def stop_process(process, signum: int = signal.SIGINT, timeout: float = 5.0) -> None:
  """`signum`, then SIGKILL after `timeout` s; waits, so no zombie remains.

  A process that has already exited (or is not a Popen) is only reaped.
  """
  if not isinstance(process, subprocess.Popen):
    return
  if process.poll() is None:
    try:
      process.send_signal(signum)
      process.wait(timeout=timeout)
    except ProcessLookupError:
      pass
    except subprocess.TimeoutExpired:
      process.kill()
  process.wait()


# ---------------------------------------------------------------------------
# The mergeable context (several workers).


def keep_subround_order_of_client_results() -> None:
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
  _check_version()

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

