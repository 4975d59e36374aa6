"""A population of runs: P members of one algorithm on one model, one program.

  state = the process's `LearningAlgorithmState`, each leaf with a leading
          member axis [P] (`stack` / `member` / `with_member`)
  next(state, member_data):    member_data[p]: member p's client datasets
    message = over members: the cohort's message(x_p, s_p, hparams_p)
    sums    = program.lanes(messages, shard)     lanes: member × client, each
                                                 from its member's x_p and η_p
    server  = over members: the cohort's server step(x_p, s_p, hparams_p, sums_p)
    then, per member: the Keras metric finalizers, the aggregator's after_round

The round is `skeleton.run_round` with these steps: the same skeleton, the
same recipe, shard program and server step as the member's own cohort process
(`cohort.build`), batched over a member axis.

Where hyperparameters live: in the state, so members differ by their state
only. The client learning rate, K and a recipe's client hyperparameters
(`Recipe.client_hparams`, e.g. FedProx's μ) are `state.client_work`; the server
optimiser's learning rate, β₁, β₂, ε (TFF's optimisers keep them in their
state, as optax's `inject_hyperparams` does for this reason) are in
`state.finalizer`, set by the ordinary `process.set_hparams`; a seed decides
a member's initial weights (the state `initialize` made under it) and the
clients it samples (the data its caller passes). K must be the same for
every member: it fixes the shard's shape. What a recipe holds as a Python
constant (FedGBO's β, a schedule's shape) is the same for every member of one
population.
"""

import collections
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.rounds import cohort_data
from tff_adaptive.rounds import cohort_next
from tff_adaptive.rounds import pfor_trace
from tff_adaptive.rounds import skeleton
from tff_adaptive.rounds import stateful


def stack(states: Sequence):
  """The population state whose member p is `states[p]` (ordinary states)."""
  if not states:
    raise ValueError('a population needs at least one member state; stack got none')
  return tf.nest.map_structure(lambda *leaves: np.stack([np.asarray(x) for x in leaves]),
                               *states)


def size(state) -> int:
  """How many members a population state has."""
  return int(np.shape(tf.nest.flatten(state)[0])[0])


def member(state, index: int):
  """Member `index`'s ordinary state (what its own process's `next` takes)."""
  _check_index(state, index)
  return tf.nest.map_structure(lambda leaf: np.asarray(leaf)[index], state)


def with_member(state, index: int, member_state):
  """The population state with member `index` replaced by `member_state`."""
  _check_index(state, index)

  def put(leaf, value):
    leaf = np.array(leaf)
    leaf[index] = np.asarray(value)
    return leaf

  return tf.nest.map_structure(put, state, member_state)


def _check_index(state, index: int):
  if tf.nest.flatten(state) and not 0 <= index < size(state):
    raise ValueError(f'member index must be in [0, {size(state)}); got {index}')


def member_metrics(metrics, index: int):
  """Member `index`'s round metrics (as its own process's `next` returns them)."""
  return tf.nest.map_structure(lambda leaf: np.asarray(leaf)[index], metrics)


def member_output(output, index: int):
  """Member `index`'s part of `next`'s output, as its own process's `next`
  returns it (with its clients' new states, for clients that keep state)."""
  state, metrics = member(output.state, index), member_metrics(output.metrics, index)
  if isinstance(output, stateful.StatefulClientsOutput):
    return stateful.StatefulClientsOutput(state, metrics, output.clients[index])
  return tff.learning.templates.LearningProcessOutput(state, metrics)


class PopulationProcess:
  """P runs of one cohort process, one program (module docstring).

  `initialize(size)`: P copies of the process's initial state (then make them
  differ with `set_hparams` / `with_member`, or build the population state
  from member states with `stack`); `next(state, member_data)` → a
  `LearningProcessOutput` whose state and metrics have the member axis;
  `member(state, p)` is member p's ordinary state: its own process's
  `next`, checkpoints and accessors take it.

  A process built with `CohortExecution(in_process=False, num_shards=W)` (the
  cohort on TFF workers) makes a population whose client phase is split into W
  shards of clients, every member's clients in each (each member's sums add up
  over the shards), run through the current TFF context: on W workers, one
  shard each; the rest of the round runs in this process.

  Attributes:
    process: the members' own process (a cohort process).
  """

  def __init__(self, process):
    parts = getattr(process, 'round_parts', None)
    execution = getattr(process, 'execution', None)
    if parts is None or not (getattr(execution, 'in_process', False) or
                             getattr(execution, 'num_shards', None)):
      raise TypeError('build_population takes a cohort process (built with execution='
                      'CohortExecution(in_process=True), or in_process=False and num_shards '
                      'for TFF workers, and no option that runs it per client); got '
                      f'{type(process).__name__}')
    why = parts.program.aggregation.form.not_in_population
    if why:
      raise ValueError(f'{process.recipe.name}: {why}')
    self.process = process
    self.next = PopulationNext(parts, process)

  def initialize(self, size: int):
    if size < 1:
      raise ValueError(f'size must be at least 1; got {size}')
    return stack([self.process.initialize()] * size)

  def get_model_weights(self, state, index: int):
    return self.process.get_model_weights(member(state, index))

  def set_hparams(self, state, index: int, hparams):
    """The population state with member `index`'s hyperparameters set
    (`process.set_hparams`' structure: client_work, finalizer)."""
    return with_member(state, index, self.process.set_hparams(member(state, index), hparams))

  stack = staticmethod(stack)
  member = staticmethod(member)
  with_member = staticmethod(with_member)
  member_metrics = staticmethod(member_metrics)
  member_output = staticmethod(member_output)


def build_population(process) -> PopulationProcess:
  """A population of `process`'s runs (`PopulationProcess`)."""
  return PopulationProcess(process)


class PopulationNext:
  """`next(state, member_data)` of a population of one cohort process's runs."""

  def __init__(self, parts: cohort_next.RoundParts, process):
    self._parts = parts
    self._process = process
    program, aggregation = parts.program, parts.program.aggregation
    over_members = lambda fn: lambda *args: pfor_trace.vectorized_map(lambda a: fn(*a), args)
    specs = [_with_member_axis(s) for s in parts.tensor_specs()]
    self._message = tf.function(over_members(parts.message_fn), autograph=False)
    self._message.get_concrete_function(*specs)
    # The shard program's relaxed signature with a member axis: one trace for
    # every population size and shard shape (epochs pad to other step counts).
    message_spec, shard_spec = parts.traced_shard.structured_input_signature[0]
    self._lanes = tf.function(program.lanes, autograph=False,
                              jit_compile=parts.jit_compile == 'program',
                              input_signature=[_with_member_axis(message_spec),
                                               _with_member_axis(shard_spec)])
    server = lambda *args: aggregation.server(parts.server_round, *args)
    self._server = tf.function(over_members(server), autograph=False)
    self._server.get_concrete_function(
        *specs[:3], _with_member_axis(tff.types.type_to_tf_tensor_specs(parts.sums_type)))
    self._num_shards, self._placement = None, skeleton.IN_PROCESS
    if not process.execution.in_process:
      self._num_shards = process.execution.num_shards
      self._placement = skeleton.ClientPhaseThroughTff(
          _client_phase_computation(self._lanes, *self._lanes.input_signature))
    self._steps = skeleton.RoundSteps(
        message=self._message_step, client_phase=self._lanes, server=self._server_step,
        aggregation=_PerMember(parts.steps.aggregation),
        message_takes_aggregator_state=parts.steps.message_takes_aggregator_state,
        measure_client_drift=parts.steps.measure_client_drift,
        stateful_clients=parts.steps.stateful_clients)

  def __call__(self, state, member_data):
    """`LearningProcessOutput` with a member axis; for clients that keep state,
    `StatefulClientsOutput` whose `clients[p]` are member p's clients' new
    states, in the order member p's clients were given."""
    shard, orders = self._shard_and_orders(state, member_data)
    shards = [shard] if self._num_shards is None else _split(shard, self._num_shards)
    output = skeleton.run_round(self._placement, self._steps, state, shards)
    if not self._steps.stateful_clients:
      return output
    clients = tf.nest.map_structure(lambda *parts: np.concatenate(parts, axis=1),
                                    *output.clients)
    return stateful.StatefulClientsOutput(output.state, output.metrics,
                                          self._clients(clients, orders))

  def _clients(self, outputs, orders):
    """Each member's clients' outputs (leaves [P, C, ...]) as `client_output`
    values, in the order its clients were given."""
    return [cohort_next.in_input_order([tf.nest.map_structure(lambda leaf: leaf[p], outputs)],  # pylint: disable=cell-var-from-loop
                                       order, self._process.client_output)
            for p, order in enumerate(orders)]

  def shard(self, state, member_data):
    """`member_data` as the population's shard (leaves [P, C, ...]). Per member:
    a list of client datasets (of `process.client_input(...)` for clients that
    keep state), of `cohort_data.client_batches`, or the member's own shards
    (`process.make_shards`, with `with_client_states` / `with_test_batches`
    where the process takes them); or, whole, a shard with leaves [P, C, ...]."""
    return self._shard_and_orders(state, member_data)[0]

  def _shard_and_orders(self, state, member_data):
    """(the shard, per member the input index of each of its lanes' clients)."""
    members = size(state)
    if isinstance(member_data, collections.abc.Mapping):
      clients = int(np.shape(member_data['mask'])[1])
      return member_data, [list(range(clients))] * members
    if not isinstance(member_data, (list, tuple)) or len(member_data) != members:
      raise ValueError(f'next takes one list of client datasets per member ({members}); got '
                       f'{_describe(member_data)}')
    local_steps = {int(k) for k in np.asarray(state.client_work['local_steps'])}
    if len(local_steps) != 1:
      raise ValueError('every member of a population runs the same local steps K (it fixes '
                       f'the program\'s shape); got {sorted(local_steps)}')
    steps = self._process.batches_per_client(local_steps.pop())
    # Members given the very same data object (bin/train --together's members
    # of one seed) get its shard built once.
    built = {}
    for cohort in member_data:
      if id(cohort) not in built:
        built[id(cohort)] = _member_shard(self._process, cohort, steps)
    shards, orders = zip(*[built[id(cohort)] for cohort in member_data])
    cohorts = {int(np.shape(s['mask'])[0]) for s in shards}
    if len(cohorts) != 1:
      raise ValueError('every member of a population trains the same number of clients per '
                       f'round (it fixes the program\'s shape); got {sorted(cohorts)}')
    return _joined(shards, np.stack), list(orders)

  def _message_step(self, weights, *rest):
    return cohort_next.with_tensors(self._message, weights, *rest)

  def _server_step(self, weights, stats, hparams, sums):
    """The members' server steps at once; then, per member and eagerly, the Keras
    metric finalizers (they build metrics, i.e. variables, when called)."""
    new_weights, new_stats, metrics = cohort_next.with_tensors(self._server, weights, stats,
                                                               hparams, sums)
    finalize = self._parts.program.view.finalize
    metrics['train'] = stack([finalize(member_metrics(sums['metrics'], p))
                              for p in range(size(weights))])
    return (cohort_next.numpy_like(weights, new_weights),
            cohort_next.numpy_like(stats, new_stats), tf.nest.map_structure(np.asarray, metrics))


class _PerMember:
  """The cohort's aggregation for a population: the sums are per member
  already; the aggregator's `after_round` runs once per member."""

  def __init__(self, summed: skeleton.Summed):
    self._summed = summed

  def aggregate(self, placement, aggregator_state, results):
    return self._summed.aggregate(placement, aggregator_state, results)

  def after_round(self, placement, aggregator_state, sums, round_metrics):
    answers = [self._summed.after_round(placement, member_metrics(aggregator_state, p),
                                        member_metrics(sums, p), member_metrics(round_metrics, p))
               for p in range(size(sums))]
    return stack([a[0] for a in answers]), stack([a[1] for a in answers])


def _member_shard(process, cohort, steps: int):
  """One member's clients as one shard ([C, S, B, ...]) and, per client of
  it, the index it was given at: its shards joined (in their order), its
  clients' batches padded, or its clients' inputs (clients that keep state)."""
  if cohort and all(isinstance(c, collections.abc.Mapping) and 'mask' in c for c in cohort):
    clients = sum(int(np.shape(s['mask'])[0]) for s in cohort)
    return _joined(list(cohort), np.concatenate), list(getattr(cohort, 'order', range(clients)))
  if cohort and all(isinstance(c, collections.abc.Mapping) and 'train' in c for c in cohort):
    batches = [cohort_data.client_batches(c['train'], steps) for c in cohort]
    if not any(batches):
      raise ValueError('the sampled clients have no data')
    one = cohort_data.Shards([cohort_data.pad(batches)], groups=[list(range(len(cohort)))])
    return process.with_client_inputs(one, cohort)[0], list(range(len(cohort)))
  clients = [c if isinstance(c, list) else cohort_data.client_batches(c, steps) for c in cohort]
  if not any(clients):
    raise ValueError('the sampled clients have no data')
  return cohort_data.pad(clients), list(range(len(clients)))


def _joined(shards, join):
  """The shards' leaves joined (`join`: stack or concatenate), their batches and
  masks (and test batches) first padded to the largest steps and rows."""
  def shape(parts):
    return tuple(max(np.shape(p['mask'])[i] for p in parts) for i in (1, 2))

  to = shape(shards)
  test = shape([s['test'] for s in shards]) if 'test' in shards[0] else None
  return tf.nest.map_structure(lambda *leaves: join(leaves),
                               *[_padded(s, to, test) for s in shards])


def _padded(shard, shape, test_shape=None):
  """`shard` with its steps and rows axes padded to `shape` (zeros, mask 0);
  its test batches to `test_shape`; its clients' states as they are."""
  def pad(leaf):
    leaf = np.asarray(leaf)
    widths = [(0, 0), (0, shape[0] - leaf.shape[1]), (0, shape[1] - leaf.shape[2])]
    return np.pad(leaf, widths + [(0, 0)] * (leaf.ndim - 3))

  out = collections.OrderedDict(shard)
  for key in ('batches', 'mask'):
    out[key] = tf.nest.map_structure(pad, shard[key])
  if test_shape is not None:
    out['test'] = _padded(shard['test'], test_shape)
  return out


def _split(shard, num_shards: int) -> list:
  """`shard` (leaves [P, C, ...]) as up to `num_shards` shards of consecutive
  clients (never an empty one)."""
  clients = int(np.shape(shard['mask'])[1])
  return [tf.nest.map_structure(lambda leaf, i=part: np.asarray(leaf)[:, i[0]:i[-1] + 1], shard)
          for part in np.array_split(np.arange(clients), min(num_shards, clients))]


def _client_phase_computation(lanes, message_spec, shard_spec):
  """The lanes program over CLIENTS-placed shards, as one TFF computation."""
  message_type = tff.types.tensorflow_to_type(message_spec)
  shard_type = tff.types.tensorflow_to_type(shard_spec)
  lanes_fn = tff.tensorflow.computation(lambda message, shard: lanes(message, shard),
                                        message_type, shard_type)

  @tff.federated_computation(tff.FederatedType(message_type, tff.SERVER),
                             tff.FederatedType(shard_type, tff.CLIENTS))
  def client_phase(message, shards):
    return tff.federated_map(lanes_fn, (tff.federated_broadcast(message), shards))

  return client_phase


def _with_member_axis(specs):
  return tf.nest.map_structure(lambda s: tf.TensorSpec([None] + list(s.shape), s.dtype), specs)


def _describe(value) -> str:
  if isinstance(value, (list, tuple)):
    return f'a list of {len(value)}'
  return type(value).__name__
