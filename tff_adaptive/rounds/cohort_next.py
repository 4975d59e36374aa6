"""A cohort process's `next`: TFF's `next(state, client_datasets)`, or padded shards.

  process.next(state, client_data)
    client_data: a list of `tf.data.Dataset`s, one per client (TFF's
      `LearningProcess` contract; for a recipe whose clients keep state, one
      `process.client_input(dataset, state)` per client, as per client), or the
      padded shards of `process.make_shards` (the fast path for callers that keep
      their clients' batches as arrays: `cohort_data.ClientCache`).
    datasets → each client's batches (`cohort_data.client_batches` with the
      state's K) → `process.make_shards`: the code the fast path uses
    shards → the shard program, in process (`InProcessNext`) or through TFF

Design: the datasets are read and padded in Python, before the compiled
round, as TFF's own runtime materialises a dataset argument before its
computation runs; so `next.type_signature` stays that of the TFF computation
(`tff_next`: the state and the shards at CLIENTS), which is what the round
computes, and `initialize` and the state are the per-client process's. A
caller that samples the same clients often should keep arrays and pass
`make_shards`' shards: converting a dataset costs a pass over its data every
round.
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.rounds import cohort_data
from tff_adaptive.rounds import layout
from tff_adaptive.rounds import skeleton
from tff_adaptive.rounds import stateful


class CohortNext:
  """`process.next` of a cohort process (see module docstring).

  Attributes:
    type_signature: the TFF computation's (`process.tff_next`): shards in.
    runs: what runs the shards: an `InProcessNext` or `process.tff_next`.
  """

  def __init__(self, process, runs):
    self._process = process
    self.runs = runs
    self.type_signature = process.tff_next.type_signature

  @property
  def _name(self) -> str:
    return self._process.recipe.name

  def __call__(self, state, client_data):
    shards = self.shards(state, client_data)
    output = self.runs(state, shards)
    if not self._process.stateful_clients:
      return output
    return stateful.StatefulClientsOutput(
        output.state, output.metrics,
        in_input_order(output.clients, getattr(shards, 'order', None),
                       self._process.client_output))

  def shards(self, state, client_data):
    """`client_data` as the round's shards (shards are returned as given)."""
    if isinstance(client_data, (tf.data.Dataset, Mapping)) or not isinstance(
        client_data, (list, tuple)):
      raise TypeError(f'{self._name}: next takes client_data, a list with one entry per '
                      f'client (or make_shards\' shards); got {type(client_data).__name__}')
    kinds = {_kind(entry) for entry in client_data}
    if len(kinds) > 1 or None in kinds:
      raise TypeError(f'{self._name}: client_data must be a list of tf.data.Dataset '
                      '(OrderedDict(train=dataset, private=state) for clients that keep state) '
                      f'or make_shards\' shards; got {[type(e).__name__ for e in client_data]}')
    if kinds == {'shard'}:
      missing = sorted({key for s in client_data for key in self._process.missing_inputs(s)}
                       if self._process.stateful_clients else ())
      if missing == ['client_state']:
        raise ValueError(f'{self._name}: its clients keep state: pass '
                         'process.with_client_states(shards, states) to next')
      if missing:
        raise ValueError(f'{self._name}: its shards need {" and ".join(missing)}: pass '
                         'process.with_test_batches(shards, tests[, states]) to next')
      return client_data
    return self._from_datasets(state, client_data, kinds.pop())

  def _from_datasets(self, state, client_data, kind):
    stateful_clients = self._process.stateful_clients
    if stateful_clients != (kind == 'stateful'):
      raise TypeError(f'{self._name}: client_data of clients that keep state is one '
                      'process.client_input(dataset, state) per client, else one tf.data.Dataset'
                      f' per client; got {kind} entries')
    local_steps = self._process.batches_per_client(
        int(np.asarray(state.client_work['local_steps'])))
    datasets = [e['train'] for e in client_data] if stateful_clients else client_data
    shards = self._process.make_shards(
        [cohort_data.client_batches(ds, local_steps) for ds in datasets])
    if not stateful_clients:
      return shards
    return self._process.with_client_inputs(shards, client_data)


def _kind(entry):
  if isinstance(entry, tf.data.Dataset):
    return 'dataset'
  if isinstance(entry, Mapping) and 'mask' in entry and 'batches' in entry:
    return 'shard'
  if isinstance(entry, Mapping) and isinstance(entry.get('train'), tf.data.Dataset):
    return 'stateful'
  return None


def in_input_order(stacked_outputs, order, client_output):
  """The clients' outputs (stacked per shard) as one `client_output(value)` per
  client, in the order the clients were given: `order[k]` is the input index
  of the k-th client the shards hold (`Shards.order`; None: shard order)."""
  stacked = [tf.nest.map_structure(np.asarray, s) for s in stacked_outputs]
  in_shard_order = [client_output(tf.nest.map_structure(lambda leaf, j=j: leaf[j], s))
                    for s in stacked for j in range(len(tf.nest.flatten(s)[0]))]
  clients = [None] * len(in_shard_order)
  for position, index in enumerate(range(len(in_shard_order)) if order is None else order):
    clients[index] = in_shard_order[position]
  return clients


@dataclasses.dataclass(frozen=True)
class RoundParts:
  """What a cohort round is made of, for executions that run it in this process
  (`InProcessNext`; a population of runs, `population.py`).

  Attributes:
    message_fn: (x_t, s_t, hparams[, aggregator state]) → the shard program's message.
    program: the shard program (`cohort_program.CohortProgram`).
    traced_shard: the program traced with relaxed shapes (XLA when asked for).
    server_round: the server step without the Keras metric finalizers
      (`server.ServerRound`), run by `program.aggregation.server`.
    info: the model's and the recipe's types (`model_info.ModelInfo`).
    sums_type: the TFF type of Σ over the clients.
    steps: the round's `skeleton.RoundSteps` (TFF computations).
    jit_compile: what `CohortExecution.jit_compile` resolved to.
  """
  message_fn: Callable
  program: Any
  traced_shard: Any
  server_round: Any
  info: Any
  sums_type: tff.Type
  steps: skeleton.RoundSteps
  jit_compile: Any = False

  def tensor_specs(self):
    """TensorSpecs of (x_t, s_t, hparams[, the aggregator's state]), the message's inputs."""
    specs = [tff.types.type_to_tf_tensor_specs(t)
             for t in (self.info.weights_type, self.info.stats_type, self.info.hparams_type)]
    if self.steps.message_takes_aggregator_state:
      specs.append(tff.types.type_to_tf_tensor_specs(
          self.steps.aggregation.process.initialize.type_signature.result.member))
    return specs


class InProcessNext:
  """The shards' round in this process: `skeleton.run_round` with `IN_PROCESS`
  placement, over the same programs as `tff_next`, without an executor."""

  def __init__(self, tff_next, parts: RoundParts):
    self.type_signature = tff_next.type_signature
    self._view = parts.program.view
    # autograph=False as the shard program: the recipes branch on Python values only.
    message = tf.function(parts.message_fn, autograph=False)
    server = tf.function(functools.partial(parts.program.aggregation.server, parts.server_round),
                         autograph=False)
    # Traced now, as the TFF computations are: the first round then costs what
    # the others do (a state of another nesting would trace again, not fail).
    specs = parts.tensor_specs()
    message.get_concrete_function(*specs)
    server.get_concrete_function(*specs[:3], tff.types.type_to_tf_tensor_specs(parts.sums_type))
    self._message, self._server = message, server
    # relaxed shapes: one trace of the shard program for every cohort
    self._steps = dataclasses.replace(parts.steps, message=self._message_step,
                                      client_phase=parts.traced_shard, server=self._server_step)

  def __call__(self, state, shards):
    return skeleton.run_round(skeleton.IN_PROCESS, self._steps, state, shards)

  def _message_step(self, weights, *rest):
    return with_tensors(self._message, weights, *rest)

  def _server_step(self, weights, stats, hparams, sums):
    """The server's tf.function; then, eagerly, the Keras metric finalizers (they
    build metrics, i.e. variables, when called) and TFF's NumPy containers."""
    new_weights, new_stats, metrics = with_tensors(self._server, weights, stats, hparams, sums)
    metrics['train'] = self._view.finalize(sums['metrics'])
    return (numpy_like(weights, new_weights), numpy_like(stats, new_stats),
            tf.nest.map_structure(np.asarray, metrics))


def with_tensors(fn, weights, *rest):
  """fn(x_t, ...) called with TFF's NumPy containers as tensors (x_t a `ModelWeights`)."""
  return fn(tff.learning.models.ModelWeights(*_as_tensors(weights)), *_as_tensors(rest))


def _as_tensors(structure):
  return tf.nest.map_structure(tf.convert_to_tensor, structure)


def numpy_like(like, tensors):
  """`tensors` as NumPy values in the containers of `like` (what TFF returns)."""
  return tf.nest.pack_sequence_as(like, [t.numpy() for t in tf.nest.flatten(tensors)])
