"""The round, written once: every execution's `next` is `run_round`.

  message = broadcast(message(x_t, s_t, (η, K)[, the aggregator's state]))
  results = client phase(message, client data)     the only part that varies:
              per client: one client's round, TFF's federated_map (per_client.py)
              cohort:     the compiled shard program, once per shard (cohort.py)
  sums    = aggregate(results)                     one federated_sum, or Δ through
                                                   a `tff.aggregators` process
  server  = server step(x_t, s_t, (η, K), sums...)  (server.ServerRound)
  output  = `output`: state and metrics in TFF's layout, written here only

Where the steps run is a `Placement`: `FEDERATED` (TFF intrinsics: the round is
the body of a `tff.federated_computation`, which TFF's executors run, on one
machine or on workers), or `IN_PROCESS` (direct calls of the same TF functions
in this process, without an executor: the cohort's single-machine path), or
`ClientPhaseThroughTff` (in process but the client phase, a population's on
workers). A
round's functions are given as `RoundSteps`; what they are (TFF computations or
`tf.function`s) matches the placement.

Nothing here assumes one server state per program beyond what the state's
layout holds: a later axis of several configurations would give the steps
batched functions, not change this skeleton.
"""

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.rounds import stateful


class Aggregated(NamedTuple):
  """What aggregation hands the server step, and what it already knows.

  Attributes:
    server_inputs: the server step's arguments after (x_t, s_t, hparams).
    sums: Σ of the clients' sums (counters, metrics, fused means).
    train_metrics: the train metrics, when a `metrics_aggregator` made them
      (None: the server step finalizes them from the sums).
    after_round: (aggregator state, measurements) when the aggregation process
      already produced them (None: `after_round` of the aggregation).
  """
  server_inputs: tuple
  sums: Any
  train_metrics: Any = None
  after_round: Optional[tuple] = None


@dataclasses.dataclass(frozen=True)
class RoundSteps:
  """A round's functions (see module docstring).

  Attributes:
    message: (x_t, s_t, hparams[, aggregator state]) → what the clients receive.
    client_phase: (message, one client's or one shard's data) → its results
      (and, last, its clients' new states when they keep state).
    server: (x_t, s_t, hparams, *Aggregated.server_inputs) → (x_{t+1}, s_{t+1},
      round metrics: first_minibatch_loss, cost[, train][, client_drift]).
    aggregation: `aggregate(placement, aggregator state, results)` →
      `Aggregated`; `after_round(placement, aggregator state, sums, round
      metrics)` → (aggregator state, measurements).
    message_takes_aggregator_state: the message carries the aggregator's
      client parameters (robust aggregation's norms).
    stateful_clients: clients return new states, which go back per client.
    measure_client_drift: the metrics include `client_drift`.
  """
  message: Callable
  client_phase: Callable
  server: Callable
  aggregation: Any
  message_takes_aggregator_state: bool = False
  stateful_clients: bool = False
  measure_client_drift: bool = False


class Placement:
  """Where a round's steps run: TFF intrinsics (the base class) or direct calls."""
  in_process = False

  def at_server(self, fn, *args):
    return tff.federated_map(fn, args[0] if len(args) == 1 else args)

  def broadcast(self, value):
    return tff.federated_broadcast(value)

  def at_clients(self, fn, message, client_data):
    return tff.federated_map(fn, (message, client_data))

  def sum(self, values):
    return tff.federated_sum(values)

  def value(self, value):
    return tff.federated_value(value, tff.SERVER)

  def zip(self, structure):
    return tff.federated_zip(structure)

  def split_client_states(self, results):
    """(results, new client states): the clients' new states are their results' last part."""
    *results, states = results
    return (results[0] if len(results) == 1 else tuple(results)), states


class _InProcess(Placement):
  """The same steps as calls in this process: the client phase once per shard."""
  in_process = True

  def at_server(self, fn, *args):
    return fn(*args)

  def broadcast(self, value):
    return value

  def at_clients(self, fn, message, client_data):
    return [fn(message, data) for data in client_data]

  def sum(self, values):
    total = None
    for value in values:
      total = value if total is None else tf.nest.map_structure(tf.add, total, value)
    return total

  def value(self, value):
    return value

  def zip(self, structure):
    return structure

  def split_client_states(self, results):
    return [r[0] for r in results], [r[1] for r in results]


class ClientPhaseThroughTff(_InProcess):
  """In this process, but the client phase runs as `computation(message, client
  data)`, a TFF computation over CLIENTS-placed data that the current context
  runs (on TFF workers: one member of the data per worker); its per-member
  results come back in order."""

  def __init__(self, computation):
    self._computation = computation

  def at_clients(self, fn, message, client_data):
    del fn  # the computation runs it
    return list(self._computation(message, list(client_data)))


FEDERATED = Placement()
IN_PROCESS = _InProcess()


def run_round(placement: Placement, steps: RoundSteps, state, client_data):
  """One round: broadcast, client phase, aggregation, server step, output."""
  server_state = (state.global_model_weights, state.finalizer, state.client_work)
  message_args = server_state + (
      (state.aggregator,) if steps.message_takes_aggregator_state else ())
  message = placement.broadcast(placement.at_server(steps.message, *message_args))
  results = placement.at_clients(steps.client_phase, message, client_data)
  client_states = None
  if steps.stateful_clients:  # the new states go back per client, never summed
    results, client_states = placement.split_client_states(results)
  aggregated = steps.aggregation.aggregate(placement, state.aggregator, results)
  server = placement.at_server(steps.server, *server_state, *aggregated.server_inputs)
  aggregator_state, measurements = aggregated.after_round or steps.aggregation.after_round(
      placement, state.aggregator, aggregated.sums, server[2])
  return output(placement, state, server, aggregator_state, measurements,
                aggregated.train_metrics, steps.measure_client_drift, client_states)


def output(placement: Placement, state, server, aggregator_state, measurements, train_metrics,
           measure_client_drift: bool, client_states=None):
  """The round's output in TFF's layout: `LearningProcessOutput` (or, for clients
  that keep state, `StatefulClientsOutput` with their new states)."""
  new_weights, new_stats, round_metrics = server
  new_state = placement.zip(tff.learning.templates.LearningAlgorithmState(
      global_model_weights=new_weights, distributor=state.distributor,
      client_work=state.client_work, aggregator=aggregator_state, finalizer=new_stats))
  if train_metrics is None:
    train_metrics = round_metrics['train']
  metrics = collections.OrderedDict(
      distributor=placement.value(()),
      client_work=placement.zip(collections.OrderedDict(
          train=train_metrics, first_minibatch_loss=round_metrics['first_minibatch_loss'])),
      aggregator=measurements,
      finalizer=placement.value(()),
      cost=round_metrics['cost'])
  if measure_client_drift:
    metrics['client_drift'] = round_metrics['client_drift']
  metrics = placement.zip(metrics)
  if client_states is not None:
    return stateful.StatefulClientsOutput(new_state, metrics, client_states)
  return tff.learning.templates.LearningProcessOutput(new_state, metrics)


def federated_next(state_type, data_type, steps: RoundSteps) -> tff.Computation:
  """`process.next` as a TFF computation: the state and the client data at CLIENTS."""

  @tff.federated_computation(state_type, tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, client_data):
    return run_round(FEDERATED, steps, state, client_data)

  return next_fn


class Summed:
  """Aggregation by one sum of the clients' structures (`client.client_sums`):
  the fused mean of the per-client round, and every cohort aggregation.

  `strategy` is an aggregator's program form (`cohort_aggregation.ProgramAggregation`),
  `process` the `tff.aggregators` process whose state layout the round keeps.
  """

  def __init__(self, strategy, process):
    self.strategy = strategy
    self.process = process

  def aggregate(self, placement: Placement, aggregator_state, results) -> Aggregated:
    del aggregator_state
    sums = placement.sum(results)
    return Aggregated(server_inputs=(sums,), sums=sums)

  def after_round(self, placement: Placement, aggregator_state, sums, round_metrics):
    return self.strategy.after_round(placement, self.process, aggregator_state, sums,
                                     round_metrics)
