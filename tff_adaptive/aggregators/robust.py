"""`tff.learning.robust_aggregator`, with its norms known to the cohort program.

`robust_aggregator(zeroing=, clipping=, weighted=)` returns an aggregator
whose TFF factory is TFF's own `tff.learning.robust_aggregator(...)` (so the
per-client round aggregates with TFF's process, and both executions start
from its `initialize`), and which keeps what it was built with. TFF's factory
is an instance of a class local to `tff.aggregators.robust._make_wrapper`
whose norm estimators exist only as TFF computations: nothing in it says
which multiplier, increment or norm it uses, so the cohort program runs this
aggregator (`InProgram`), and a factory from `tff.learning.robust_aggregator`
itself per client.

The parameters of TFF's default norm processes (TFF 0.87,
`model_update_aggregator._default_zeroing` / `_default_clipping`), as
`PrivateQuantileEstimationProcess.no_noise` builds them: a
`NoPrivacyQuantileEstimatorQuery` with geometric updates, its report mapped to
multiplier·C + increment. The initial estimate, target quantile and learning
rate travel in the process state, so the cohort reads those from the state.
"""

import collections
import dataclasses
import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# TFF's clipping arithmetic and count dtype: the cohort's zeroing and clipping are theirs.
from tensorflow_federated.python.aggregators import robust as tff_robust
import tensorflow_privacy as tfp

from tff_adaptive.aggregators import base


@dataclasses.dataclass(frozen=True)
class NormEstimate:
  """One adaptive norm: a no-noise quantile estimate of the clients' norms."""
  prefix: str             # TFF's state and measurement names: prefix + 'ing_norm', ...
  norm_order: float       # the norm compared with the estimate (TFF: inf for zeroing, 2 clipping)
  initial_estimate: float
  target_quantile: float
  learning_rate: float
  multiplier: float = 1.0
  increment: float = 0.0


ZEROING = NormEstimate('zero', math.inf, 10.0, 0.98, math.log(10.0), multiplier=2.0,
                       increment=1.0)
CLIPPING = NormEstimate('clipp', 2.0, 1.0, 0.8, 0.2)


class RobustFactory(base.FromTffLearning):
  """What `robust_aggregator` built; `create` is TFF's factory's."""
  tff_builder = staticmethod(tff.learning.robust_aggregator)

  @property
  def norms(self) -> tuple[NormEstimate, ...]:
    """The adaptive norms, outermost first (TFF wraps zeroing around clipping)."""
    return (ZEROING,) * self.zeroing + (CLIPPING,) * self.clipping

  def query_states(self, aggregator_state) -> list:
    """The norms' query states, outermost first, from the nested process state."""
    states = []
    for norm in self.norms:
      states.append(aggregator_state[norm.prefix + 'ing_norm'][0])
      aggregator_state = aggregator_state['inner_agg']
    return states

  def in_program(self, sum_extra: bool) -> base.InProgram:
    return InProgram(self, sum_extra)


def robust_aggregator(*, zeroing: bool = True, clipping: bool = True,
                      weighted: bool = True) -> RobustFactory:
  """`tff.learning.robust_aggregator(zeroing=, clipping=, weighted=)` (see module docstring)."""
  return RobustFactory.of_kind(zeroing, clipping, weighted)


class InProgram(base.InProgram):
  """`robust_aggregator` in the program: TFF's zeroing and clipping factories
  (`tff.aggregators.zeroing_factory` around `clipping_factory` around the mean),
  each with a no-noise `PrivateQuantileEstimationProcess` as its norm.

  Before the clients, per norm (outermost first), as the process's `report`
  and its query's `derive_sample_params`: the norm N = multiplier·estimate +
  increment and the query's sample params, broadcast with the model.
  Per client, inside the program, as TFF's `zero_fn` / `clip_fn` (their
  tf.cond as a select, `_select`):
    zeroing   n = ‖v‖_∞; n > N: v := 0 (the weight stays)   zeroed_count += [n > N]
    clipping  n = ‖v‖_2 (of the zeroed v); v := v·N/n if n > N  clipped_count += [n > N]
    each norm: the query's preprocess_record(params, n), a sum over clients
  then summed as the mean sums them: Σ w·v, Σ w (uniform weights are 1, so
  Σ v and the client count of `UnweightedMeanFactory`).
  Once per round at the server: Σ w·v / Σ w (`tf.math.divide`, MeanFactory's
  and UnweightedMeanFactory's), each query's get_noised_result(Σ records,
  state) gives the next estimate; the measurements are the norms used and
  the counts, nested as TFF's (zeroing/clipping/mean).
  """
  not_in_population = 'robust aggregation has no population form yet (the mean has)'

  def __init__(self, aggregator: RobustFactory, sum_extra: bool):
    super().__init__(aggregator, sum_extra)
    self.norms = aggregator.norms
    # The very query `PrivateQuantileEstimationProcess.no_noise` builds.
    self.queries = [tfp.NoPrivacyQuantileEstimatorQuery(
        n.initial_estimate, n.target_quantile, n.learning_rate, geometric_update=True)
                    for n in self.norms]
    self._mean_measurements = None  # set by `process`
    self._update_in_process = tf.function(self.update)

  def process(self, delta_type, extra_type):
    process = super().process(delta_type, extra_type)
    # The mean's measurements (tensor-free) inside the norms' ones.
    inner = process.next.type_signature.result.measurements.member
    for norm in self.norms:
      inner = inner[norm.prefix + 'ing']
    self._mean_measurements = base.tensor_free_value(inner)
    return process

  def client_params(self, aggregator_state):
    return self._params(self.aggregator.query_states(aggregator_state))

  def client_params_type(self):
    if not self.norms:  # zeroing=False, clipping=False: TFF's plain mean
      return None
    return tff.tensorflow.computation(
        lambda: self._params([q.initial_global_state() for q in self.queries])
    ).type_signature.result

  def _params(self, query_states):
    return collections.OrderedDict(
        (norm.prefix, collections.OrderedDict(
            norm=_report(norm, state), sample=query.derive_sample_params(state)))
        for norm, query, state in zip(self.norms, self.queries, query_states))

  def client_part(self, delta, extra, params):
    records = collections.OrderedDict()
    for norm, query in zip(self.norms, self.queries):
      bound = params[norm.prefix]
      apply = _zero if norm.prefix == ZEROING.prefix else _clip
      delta, global_norm, count = apply(delta, bound['norm'])
      records[norm.prefix] = collections.OrderedDict(
          record=query.preprocess_record(bound['sample'], global_norm), count=count)
    return delta, extra, {'robust': records}

  def means(self, sums):
    total = sums['weight'] if self.aggregator.weighted else sums['clients']
    mean_delta = tf.nest.map_structure(lambda v: tf.math.divide(v, tf.cast(total, v.dtype)),
                                       sums['weighted_delta'])
    return mean_delta, None, None

  def update(self, aggregator_state, sums):
    """(the new state, the measurements) from the state and the round's sums."""
    new_states, measured = [], []
    states = self.aggregator.query_states(aggregator_state)
    for norm, query, state in zip(self.norms, self.queries, states):
      summed = sums['robust'][norm.prefix]
      _, new_state, _ = query.get_noised_result(summed['record'], state)
      new_states.append(new_state)
      measured.append((_report(norm, state), summed['count']))
    return (_with_query_states(aggregator_state, self.norms, new_states),
            self._measurements(measured))

  def after_round(self, placement, process, aggregator_state, sums, round_metrics):
    del process, round_metrics
    if placement.in_process:
      new_state, measurements = self._update_in_process(
          tf.nest.map_structure(tf.convert_to_tensor, aggregator_state), sums)
      as_numpy = lambda like, tensors: tf.nest.pack_sequence_as(
          like, [t.numpy() for t in tf.nest.flatten(tensors)])
      return (as_numpy(aggregator_state, new_state),
              tf.nest.map_structure(np.asarray, measurements))
    update = tff.tensorflow.computation(self.update, aggregator_state.type_signature.member,
                                        sums.type_signature.member)
    new_state, measurements = tff.federated_map(update, (aggregator_state, sums))
    return new_state, measurements

  def _measurements(self, measured):
    """TFF's nesting: OrderedDict(zeroing=OrderedDict(clipping=<the mean's>,
    clipping_norm, clipped_count), zeroing_norm, zeroed_count)."""
    measurements = self._mean_measurements
    for norm, (reported, count) in reversed(list(zip(self.norms, measured))):
      measurements = collections.OrderedDict([
          (norm.prefix + 'ing', measurements), (norm.prefix + 'ing_norm', reported),
          (norm.prefix + 'ed_count', count)])
    return measurements


def _report(norm: NormEstimate, query_state):
  """The norm process's `report`: `no_noise` maps it affinely only when not 1·C + 0."""
  if norm.multiplier == 1.0 and norm.increment == 0.0:
    return query_state.current_estimate
  return norm.multiplier * query_state.current_estimate + norm.increment


def _zero(value, zeroing_norm):
  """TFF's `zeroing_factory` zero_fn (norm_order inf, robust_aggregator's)."""
  global_norm = tf.reduce_max(tf.stack(
      [tf.cast(_norm(a, np.inf), tf.float32) for a in tf.nest.flatten(value)]))
  should_zero = global_norm > zeroing_norm
  zeroed = _select(should_zero, tf.nest.map_structure(tf.zeros_like, value), value)
  return zeroed, global_norm, tf.cast(should_zero, tff_robust.COUNT_TF_TYPE)


def _clip(value, clipping_norm):
  """TFF's `clipping_factory` clip_fn (`_clip_by_global_l2_norm`)."""
  global_norm = tf.math.sqrt(tf.reduce_sum(tf.stack(
      [tf.cast(_norm(a, 2) ** 2, tf.float32) for a in tf.nest.flatten(value)])))
  clipped = _select(
      tf.math.greater(global_norm, clipping_norm),
      tff_robust._do_clip_by_global_l2_norm(  # pylint: disable=protected-access
          value, clipping_norm, global_norm), value)
  return clipped, global_norm, tf.cast(global_norm > clipping_norm, tff_robust.COUNT_TF_TYPE)


def _select(condition, if_true, if_false):
  """TFF's `tf.cond(condition, ...)` as a select of both (cheap) branches: under
  tf.vectorized_map a cond on a per-client condition becomes a dynamic
  partition of the clients, which XLA cannot compile."""
  return tf.nest.map_structure(lambda a, b: tf.where(condition, a, b), if_true, if_false)


def _norm(tensor, order):
  """`tf.norm(tensor, ord=order)` as TFF's global norms call it, over the flattened
  tensor (the same reduction) and squeezing only that axis: tf.norm's
  squeeze(axis=None) also removes the client axis of a shard of one client
  under tf.vectorized_map."""
  return tf.norm(tf.reshape(tensor, [-1]), ord=order, axis=0)


def _with_query_states(aggregator_state, norms, new_states):
  """`aggregator_state` with the norms' query states replaced, containers kept."""
  if not norms:
    return aggregator_state
  key = norms[0].prefix + 'ing_norm'
  state = collections.OrderedDict(aggregator_state)
  state[key] = (new_states[0],) + tuple(aggregator_state[key][1:])
  state['inner_agg'] = _with_query_states(aggregator_state['inner_agg'], norms[1:],
                                          new_states[1:])
  return state

