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

import collections
import functools
from collections.abc import Mapping

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.rounds import cohort_data
from tff_adaptive.rounds import layout
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
    return stateful.StatefulClientsOutput(output.state, output.metrics,
                                          _in_input_order(output.clients, shards))

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
      if self._process.stateful_clients and any('client_state' not in s for s in client_data):
        raise ValueError(f'{self._name}: its clients keep state: pass '
                         'process.with_client_states(shards, states) to next')
      return client_data
    return self._from_datasets(state, client_data, kinds.pop())

  def _from_datasets(self, state, client_data, kind):
    stateful_clients = self._process.stateful_clients
    if stateful_clients != (kind == 'stateful'):
      raise TypeError(f'{self._name}: client_data of clients that keep state is one '
                      'process.client_input(dataset, state) per client, else one tf.data.Dataset'
                      f' per client; got {kind} entries')
    local_steps = int(np.asarray(state.client_work['local_steps']))
    datasets = [e['train'] for e in client_data] if stateful_clients else client_data
    shards = self._process.make_shards(
        [cohort_data.client_batches(ds, local_steps) for ds in datasets])
    if not stateful_clients:
      return shards
    return self._process.with_client_states(
        shards, [stateful.flat_state(e['private']) for e in client_data])


def _kind(entry):
  if isinstance(entry, tf.data.Dataset):
    return 'dataset'
  if isinstance(entry, Mapping) and 'mask' in entry and 'batches' in entry:
    return 'shard'
  if isinstance(entry, Mapping) and isinstance(entry.get('train'), tf.data.Dataset):
    return 'stateful'
  return None


def _in_input_order(stacked_states, shards):
  """The clients' new states (stacked per shard) as one `flat_state` per client, in
  the order the clients were given (`Shards.order`; plain shards: shard order)."""
  stacked = [[np.asarray(leaf) for leaf in tf.nest.flatten(s)] for s in stacked_states]
  in_shard_order = [stateful.flat_state([leaf[j] for leaf in leaves])
                    for leaves in stacked for j in range(len(leaves[0]))]
  order = getattr(shards, 'order', range(len(in_shard_order)))
  clients = [None] * len(in_shard_order)
  for position, index in enumerate(order):
    clients[index] = in_shard_order[position]
  return clients


class InProcessNext:
  """The shards' round as `tf.function`s in this process: same programs, no executor."""

  def __init__(self, tff_next, message_fn, program, traced_shard, server_round, info,
               sums_type, aggregator_process, measure_client_drift):
    self.type_signature = tff_next.type_signature
    self._aggregator_process = aggregator_process
    self._aggregation = program.aggregation
    self._measure_client_drift = measure_client_drift
    self._shard = traced_shard  # relaxed shapes: one trace for every cohort
    self._view = program.view
    self._stateful = program.stateful
    self._message = tf.function(message_fn)
    self._sends_params = self._aggregation.client_params_type() is not None
    self._server = tf.function(functools.partial(self._aggregation.server, server_round))
    # Traced now, as the TFF computations are: the first round then costs what
    # the others do (a state of another nesting would trace again, not fail).
    specs = [tff.types.type_to_tf_tensor_specs(t)
             for t in (info.weights_type, info.stats_type, layout.HPARAMS_TYPE)]
    self._message.get_concrete_function(*specs, *(
        [tff.types.type_to_tf_tensor_specs(
            aggregator_process.initialize.type_signature.result.member)]
        if self._sends_params else []))
    self._server.get_concrete_function(*specs, tff.types.type_to_tf_tensor_specs(sums_type))

  def __call__(self, state, shards):
    weights, stats, hparams = _as_tensors((state.global_model_weights, state.finalizer,
                                           state.client_work))
    weights = tff.learning.models.ModelWeights(*weights)
    message = self._message(weights, stats, hparams, *(
        [_as_tensors(state.aggregator)] if self._sends_params else []))
    sums, client_states = None, []
    for shard in shards:
      shard_sums = self._shard(message, shard)
      if self._stateful:
        shard_sums, shard_states = shard_sums
        client_states.append(shard_states)
      sums = shard_sums if sums is None else tf.nest.map_structure(tf.add, sums, shard_sums)
    new_weights, new_stats, metrics = self._server(weights, stats, hparams, sums)
    metrics['train'] = self._view.finalize(sums['metrics'])
    metrics = tf.nest.map_structure(np.asarray, metrics)
    aggregator_state, measurements = self._aggregation.after_round_in_process(
        self._aggregator_process, state.aggregator, sums, metrics)
    new_state = state._replace(
        global_model_weights=_numpy_like(state.global_model_weights, new_weights),
        finalizer=_numpy_like(state.finalizer, new_stats), aggregator=aggregator_state)
    out = collections.OrderedDict(
        distributor=(), client_work=collections.OrderedDict(
            train=metrics['train'], first_minibatch_loss=metrics['first_minibatch_loss']),
        aggregator=measurements,
        finalizer=(), cost=metrics['cost'])
    if self._measure_client_drift:
      out['client_drift'] = metrics['client_drift']
    if self._stateful:
      return stateful.StatefulClientsOutput(new_state, out, client_states)
    return tff.learning.templates.LearningProcessOutput(new_state, out)


def _as_tensors(structure):
  return tf.nest.map_structure(tf.convert_to_tensor, structure)


def _numpy_like(like, tensors):
  """`tensors` as NumPy values in the containers of `like` (what TFF returns)."""
  return tf.nest.pack_sequence_as(like, [t.numpy() for t in tf.nest.flatten(tensors)])
