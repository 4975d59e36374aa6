"""Execution 2: the whole cohort's round as one compiled program.

  next(state, client_data):      client datasets, or `cohort_data` padded shards
    shards = make_shards(each client's batches)    (datasets: cohort_next.py)
    message = (x_t, broadcast(s_t), (η, K))
    per shard, one TF program:
      for each client (tf.vectorized_map, or tf.map_fn in sequence):
        carry = loop.init(x_t, broadcast)                       client.ClientLoop
        [Recipe.full_gradient: for each step, at x_t: carry = loop.anchor(carry, g, n)]
        for each step with real rows:  g, loss = view.loss_and_grads(y, batch, mask)
                                       carry = loop.step(carry, g, loss, n, η)
        result = loop.final(carry, x_t)
      Σ over clients of client.client_sums(result)   (the per-client round's sums)
    Σ over shards; server.ServerRound.from_weighted_sums (the per-client server step)

The algorithm's math is the recipe's, run by the same `ClientLoop` and
`ServerRound` as the per-client execution; only where the gradient comes from
differs (`functional.FunctionalView` instead of the model's variables).

It is a TFF `LearningProcess`: `initialize`, the state (`layout.py`), the
accessors and `process.next`'s TFF computation (shards as a CLIENTS-placed
value, one federated_sum) are those of the per-client process, so runs switch
execution and resume from the same checkpoints, and TFF executors (several
machines: one shard per worker) run it. In one process, `in_process=True`
(the default) runs the same shard program as a `tf.function`, without
serialising the data through TFF's executor (which costs more than the
round's arithmetic for small models: docs/performance.md).

Aggregation (`cohort_aggregation.py`): the example-weighted or uniform mean
(fused, as per client), fixed-clip Gaussian DP (`privacy.dp_aggregator`),
CE-FedAvg upload compression and TFF's robust aggregator
(`aggregators.robust.robust_aggregator`: adaptive zeroing and clipping), each
applied per client inside the program; their server parts (the noise, the
mean, the robust norms' next estimates) run once per round at the server.
Robust's round norms go to the clients with the model (the message's
'aggregator'). Other aggregators (TFF's secure aggregator, factories not
built by this package), metrics aggregators and models without a functional
view run per client (`build_or_explain` warns once, naming the reason).
"""

import collections
import contextlib
import dataclasses
import functools
import logging
import re
import warnings
from typing import Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.rounds import client as client_lib
from tff_adaptive.rounds import cohort_aggregation
from tff_adaptive.rounds import cohort_next
from tff_adaptive.rounds import cohort_processes
from tff_adaptive.rounds import functional
from tff_adaptive.rounds import layout
from tff_adaptive.rounds import model_info as model_info_lib
from tff_adaptive.rounds import options as options_lib
from tff_adaptive.rounds import per_client
from tff_adaptive.rounds import recipe as recipe_lib
from tff_adaptive.rounds import recurrent
from tff_adaptive.rounds import server as server_lib
from tff_adaptive.rounds import skeleton

MODES = ('auto', 'vectorized', 'sequential')
JIT_COMPILE = (False, True, 'step', 'program', 'auto')


@dataclasses.dataclass(frozen=True)
class CohortExecution:
  """How the cohort program runs.

  Attributes:
    mode: 'vectorized' (clients in parallel, `tf.vectorized_map`),
      'sequential' (`tf.map_fn`), or 'auto': sequential for models with
      convolutions (pfor runs their gradients as while loops: slower than in
      sequence, docs/performance.md) or recurrent layers (vectorised, they run
      unrolled, recurrent.py, whose program does not build in bounded time
      for the Shakespeare GRU), else vectorized.
    in_process: run the shard program as a `tf.function` in this process
      (single-machine simulation); False: through the current TFF context.
    num_shards: split the cohort into this many shards (e.g. one per TFF
      worker); None: by size, so that padding stays under `max_waste`.
    max_waste: see `cohort_data.group_by_size`.
    jit_compile: XLA. False: none. True or 'step': compile one client step
      (gradient, optimiser step, metrics); it pays for recurrent models,
      whose steps are many small ops (a GRU step of TFF's Shakespeare task:
      3x faster per round), small feed-forward models gain nothing.
      'program': compile the whole shard program (every client's every
      step) as one XLA computation: no per-op dispatch at all, which is
      most of a small model's step (the digits MLP: ~3x faster rounds,
      docs/performance.md); XLA compiles once per shard shape
      [clients, steps, rows], so it suits rounds of fixed shape (K local
      steps, a fixed cohort) and costs a compilation per new shape otherwise.
      'auto': 'step' for recurrent models, 'program' for fixed-K rounds
      (local_steps > 0) of models without convolutions, else none: the
      cases measured faster (docs/performance.md; a CNN under XLA was not).
      The default stays False so that a library user opts in to compiling.
  """
  mode: str = 'auto'
  in_process: bool = True
  num_shards: Optional[int] = None
  max_waste: float = 0.25
  jit_compile: Union[bool, str] = False

  def __post_init__(self):
    if self.jit_compile not in JIT_COMPILE:
      raise ValueError(f"jit_compile must be False, True, 'step', 'program' or 'auto'; got "
                       f'{self.jit_compile!r}')
    if self.mode not in MODES:
      raise ValueError(f'mode must be one of {", ".join(MODES)}; got {self.mode!r}')
    if self.num_shards is not None and self.num_shards < 1:
      raise ValueError(f'num_shards must be at least 1; got {self.num_shards}')
    if not 0.0 <= self.max_waste < 1.0:
      raise ValueError(f'max_waste must be in [0, 1); got {self.max_waste}')


def execution_of(options: options_lib.RoundOptions) -> CohortExecution:
  execution = options.execution
  return CohortExecution() if isinstance(execution, str) else execution


def unsupported_reason(options: options_lib.RoundOptions, model_fn) -> Optional[str]:
  """Why this round cannot run as a cohort program (None: it can)."""
  reason = cohort_aggregation.supported(options)
  if reason is not None:
    return reason
  if options.metrics_aggregator not in (None, tff.learning.metrics.sum_then_finalize):
    return 'a metrics_aggregator runs per client'
  try:
    functional.FunctionalView(model_fn)
  except functional.Unsupported as e:
    return str(e)
  return None


def build_or_explain(model_fn, recipe: recipe_lib.Recipe, *, info, options, **kwargs):
  """The cohort process, or the per-client one with a one-line warning why."""
  reason = unsupported_reason(options, model_fn)
  if reason is not None:
    warnings.warn(f'{recipe.name}: the cohort execution does not apply ({reason}); the round '
                  'runs per client', stacklevel=3)
    return per_client.build(model_fn, recipe, info=info, options=options, **kwargs)
  return build(model_fn, recipe, info=info, options=options, **kwargs)


def shard_type(element_type, client_state=None, test: bool = False) -> tff.Type:
  """The TFF type of one shard: each batch leaf gains [clients, steps]
  dimensions; each leaf of the clients' state (a structure of tensors, for
  recipes whose clients keep one) a [clients] dimension. With `test`
  (`Recipe.user_accuracy`), the clients' test batches, padded alike."""
  batches = tff.types.type_to_tf_tensor_specs(element_type)
  batches = tf.nest.map_structure(
      lambda s: tf.TensorSpec([None, None, None] + list(s.shape[1:]), s.dtype), batches)
  fields = [('batches', tff.types.tensorflow_to_type(batches)),
            ('mask', tff.TensorType(np.float32, [None, None, None]))]
  if test:
    fields.append(('test', tff.StructWithPythonType(fields[:2], collections.OrderedDict)))
  if client_state is not None:
    stacked = tf.nest.map_structure(lambda t: tf.TensorSpec([None] + list(t.shape), t.dtype),
                                    client_state)
    fields.append(('client_state', tff.types.tensorflow_to_type(stacked)))
  return tff.StructWithPythonType(fields, collections.OrderedDict)


class CohortProgram:
  """The shard program: Σ over a shard's clients of their round sums (and,
  for recipes whose clients keep state, their new states, stacked)."""

  def __init__(self, view: functional.FunctionalView, loop: client_lib.ClientLoop,
               vectorized: bool, trainable_structure, jit_compile: bool = False,
               aggregation=None):
    self.view = view
    self.aggregation = aggregation or cohort_aggregation.Mean(loop.recipe.sum_extra)
    self.loop = loop
    self.vectorized = vectorized
    self.jit_compile = jit_compile
    self._trainable_structure = trainable_structure

  def __call__(self, message, shard):
    x_t = [tf.convert_to_tensor(t) for t in tf.nest.flatten(message['model_weights'].trainable)]
    one = lambda client: self._one_client(message, x_t, client)
    keys = ['batches', 'mask']
    if self.loop.recipe.user_accuracy:
      keys.append('test')
    if self.loop.recipe.has_client_state:
      keys.append('client_state')
    elems = collections.OrderedDict((key, shard[key]) for key in keys)
    if self.vectorized:
      out = tf.vectorized_map(one, elems, fallback_to_while_loop=True)
    else:
      out = tf.map_fn(one, elems, fn_output_signature=self._signature(message, x_t, elems))
    sums, states = out if self.stateful else (out, None)
    sums = tf.nest.map_structure(lambda t: tf.reduce_sum(t, axis=0), sums)
    return (sums, states) if self.stateful else sums

  @property
  def stateful(self) -> bool:
    """Its clients take back an output (`Recipe.has_client_output`)."""
    return self.loop.recipe.has_client_output

  def _signature(self, message, x_t, elems):
    first = tf.nest.map_structure(lambda t: t[0], elems)
    graph = tf.function(lambda c: self._one_client(message, x_t, c)).get_concrete_function(
        tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), first))
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype),
                                 graph.structured_outputs)

  def _one_client(self, message, x_t, client):
    batches, mask = client['batches'], client['mask']
    lr = message['hparams']['learning_rate']
    ua = self._user_accuracy(x_t, lr, client) if self.loop.recipe.user_accuracy else ()
    carry = self.loop.init(x_t, message['broadcast'], client.get('client_state', ()))
    if self.loop.recipe.full_gradient:
      carry = self._full_gradient_pass(carry, x_t, batches, mask)

    def step(state, group):
      carry, metrics = state
      batch, rows = group[0]
      grads, loss, data_loss, predictions = self.view.loss_and_grads(
          self.loop.gradient_point(carry), batch, rows)
      metrics = self.view.add_metrics(metrics, batch, predictions, rows, data_loss)
      n = tf.add_n([tf.reduce_sum(r) for _, r in group])
      passes = []  # `grad_at`'s forward passes, counted in the metrics after the step
      grad_at = (functools.partial(self._grad_at, group, passes)
                 if self.loop.recipe.gradient_fn else None)
      stepped = self.loop.step(carry, grads, loss, tf.cast(n, tf.int64), lr, grad_at)
      for args in passes:
        metrics = self.view.add_metrics(metrics, *args)
      return stepped, metrics

    carry, metrics = self._over_steps(step, batches, mask, (carry, self.view.zero_metrics()),
                                      self.loop.recipe.batches_per_step)
    result = self.loop.final(carry, x_t)._replace(user_accuracy=ua)
    sums = self.aggregation.client_sums(result, metrics, self._trainable_structure,
                                        message.get('aggregator'))
    return (sums, self.loop.client_output(result)) if self.stateful else sums

  def _user_accuracy(self, x_t, lr, client):
    """`Recipe.user_accuracy`: the personalised weights (from the client's first
    training batch) on its padded test batches, in inference mode; no metrics."""
    first = ((tf.nest.map_structure(lambda t: t[0], client['batches']), client['mask'][0]),)
    weights = self.loop.personalized_weights(
        x_t, lr, functools.partial(self._grad_at, first, []))

    def test_batch(ua, group):
      batch, rows = group[0]
      labels, logits, loss = self.view.evaluate(weights, batch, rows)
      return client_lib.add_user_accuracy(ua, labels, logits, loss, rows)

    test = client['test']
    return self._over_steps(test_batch, test['batches'], test['mask'],
                            client_lib.zero_user_accuracy())

  def _full_gradient_pass(self, carry, x_t, batches, mask):
    """`Recipe.full_gradient`: `loop.anchor` at x_t over the steps the client
    trains on, padded steps and rows masked as in the training loop; no metrics."""
    y0 = tuple(x_t)

    def anchor(carry, group):
      batch, rows = group[0]
      grads, _, _, _ = self.view.loss_and_grads(y0, batch, rows)
      return self.loop.anchor(carry, grads, tf.cast(tf.reduce_sum(rows), tf.int64))

    return self._over_steps(anchor, batches, mask, carry)

  def _grad_at(self, group, passes, weights, j):
    """`Recipe.gradient_fn`'s grad_at from the functional view; records the pass."""
    batch, rows = group[j]
    grads, loss, data_loss, predictions = self.view.loss_and_grads(weights, batch, rows)
    passes.append((batch, predictions, rows, data_loss))
    return grads, loss

  def _over_steps(self, step_fn, batches, mask, state, per_step: int = 1):
    """state = step_fn(state, group) for each step of the client's padded batches,
    group being `per_step` consecutive (batch, rows) pairs (under XLA when
    `jit_compile`); a step with a batch without real rows (a shorter client, a
    last incomplete group) changes nothing."""
    if self.jit_compile:
      step_fn = tf.function(step_fn, jit_compile=True)

    def body(s, state):
      group = tuple((tf.nest.map_structure(lambda t, i=s * per_step + j: t[i], batches),
                     mask[s * per_step + j]) for j in range(per_step))
      new = step_fn(state, group)
      active = tf.reduce_all([tf.reduce_sum(rows) > 0 for _, rows in group])
      return s + 1, tf.nest.map_structure(lambda a, b: tf.where(active, a, b), new, state)

    _, state = tf.while_loop(lambda s, _: s < tf.shape(mask)[0] // per_step, body,
                             (tf.constant(0), state))
    return state


_PFOR_FALLBACK = re.compile(r'Using a while_loop for converting (\w+)|'
                            r'(Conv2DBackpropFilter) uses a while_loop')


@contextlib.contextmanager
def _pfor_fallbacks_in_one_line():
  """pfor logs a warning for every op it runs client by client in a loop, at
  every trace (dozens of lines for CE-FedAvg's encoder): said once instead."""
  ops = set()

  def keep(record: logging.LogRecord) -> bool:
    match = _PFOR_FALLBACK.match(record.getMessage())
    if match:
      ops.add(match.group(1) or match.group(2))
    return match is None

  logger = logging.getLogger('tensorflow')  # tf_logging's
  logger.addFilter(keep)
  try:
    yield
  finally:
    logger.removeFilter(keep)
    if ops:
      logger.warning('cohort: tf.vectorized_map runs %s client by client in a loop (no '
                     'vectorising converter): same results, slower; '
                     "CohortExecution(mode='sequential') may be faster", ', '.join(sorted(ops)))


def resolved_jit_compile(jit_compile, view: functional.FunctionalView, local_steps: int):
  """False, 'step' or 'program' for `CohortExecution.jit_compile` (see there)."""
  if jit_compile != 'auto':
    return 'step' if jit_compile is True else jit_compile
  if view.has_rnn:
    return recurrent.AUTO_JIT_COMPILE if getattr(view, 'unroll_rnn', False) else 'step'
  return 'program' if local_steps > 0 and not view.has_conv_or_rnn else False


def _traced(program: CohortProgram, xla: bool, message_type, data_type):
  """The shard program traced once, with relaxed shapes ([None] clients, steps, rows).

  The TFF computation calls this graph, and in process it runs as is. Tracing the
  program is most of a small model's build (pfor converts the client loop:
  seconds), which tracing it a second time for the TFF computation doubled.
  """
  with _pfor_fallbacks_in_one_line():
    # autograph=False: the program's loops are explicit (tf.while_loop, map_fn,
    # vectorized_map) and the recipes branch on Python values only, so converting
    # every function it calls buys nothing and was a third of a first build's time.
    return tf.function(
        program, jit_compile=xla, autograph=False,
        input_signature=[tff.types.type_to_tf_tensor_specs(message_type),
                         tff.types.type_to_tf_tensor_specs(data_type)]).get_concrete_function()


def build(model_fn, recipe: recipe_lib.Recipe, *, client_learning_rate: float, local_steps: int,
          options: options_lib.RoundOptions, info: model_info_lib.ModelInfo):
  """The cohort `LearningProcess` (see module docstring)."""
  per_client.check_client_state_options(recipe, options)
  execution = execution_of(options)
  # Keras' GRU/LSTM fast path recompiles at every XLA call (functional._generic_rnn).
  view = functional.FunctionalView(model_fn, generic_rnn=bool(execution.jit_compile))
  # Recurrent layers vectorise unrolled, or run in sequence (recurrent.py).
  vectorized = recurrent.vectorise(execution.mode, view, execution.jit_compile)
  view.unroll_rnn = vectorized and view.has_rnn
  jit_compile = resolved_jit_compile(execution.jit_compile, view, local_steps)
  loop = client_lib.ClientLoop(recipe, options.weighting_for(recipe), options.measure_client_drift,
                               branchless=vectorized)
  trainable_structure = tff.types.type_to_tf_tensor_specs(info.weights_type.trainable)
  aggregation = cohort_aggregation.for_options(options, recipe)
  program = CohortProgram(view, loop, vectorized, trainable_structure,
                          jit_compile=jit_compile == 'step',
                          aggregation=aggregation)
  stateful_clients = recipe.has_client_output
  client_state_arguments = (per_client.client_state_arguments(recipe, info)
                            if stateful_clients else {})
  data_type = shard_type(info.element_type,
                         client_state_arguments.get('client_state_structure')
                         if recipe.has_client_state else None, recipe.user_accuracy)
  message_type = program_message_type(info.message_type, aggregation)
  traced = _traced(program, jit_compile == 'program', message_type, data_type)

  @tff.tensorflow.computation(message_type, data_type)
  def shard_fn(message, shard):
    return traced(message, shard)

  sums_type = shard_fn.type_signature.result
  if stateful_clients:  # (sums, the clients' outputs)
    sums_type = sums_type[0]
  server_round = server_lib.ServerRound(
      recipe, info.costs(recipe, sums_type.weighted_delta, sums_type.weighted_extra,
                         options.fb_flops_per_example),
      info.finalizers, options.measure_client_drift)

  @tff.tensorflow.computation(info.weights_type, info.stats_type, layout.HPARAMS_TYPE, sums_type)
  def server_round_fn(model_weights, stats, hparams, sums):
    return aggregation.server(server_round, model_weights, stats, hparams, sums)

  # The process the per-client round would aggregate with: its `initialize`
  # gives both executions the same state.
  process = aggregation.create(sums_type)
  initialize_fn = layout.initial_state_computation(
      info.model_fn, client_learning_rate, local_steps, process, info.init_stats)
  state_type = initialize_fn.type_signature.result
  message_fn = _message_computation(info, recipe, aggregation, state_type.member.aggregator)

  steps = skeleton.RoundSteps(
      message=message_fn, client_phase=shard_fn, server=server_round_fn,
      aggregation=skeleton.Summed(aggregation, process),
      message_takes_aggregator_state=message_fn is not info.server_message_fn,
      stateful_clients=stateful_clients, measure_client_drift=options.measure_client_drift)
  next_fn = skeleton.federated_next(state_type, data_type, steps)

  # Keras metric finalizers build metrics (variables) when called: in-process,
  # they run eagerly on the summed values, outside the server's tf.function.
  unfinalized = server_lib.ServerRound(recipe, server_round.costs, None,
                                       options.measure_client_drift)
  in_process = cohort_next.InProcessNext(
      next_fn, functools.partial(program_message, recipe, aggregation), program, traced,
      unfinalized, info, sums_type, steps)
  process_class = StatefulCohortProcess if stateful_clients else CohortProcess
  if recipe.user_accuracy:
    process_class = PersonalizedCohortProcess
    # Evaluations take every client: per client, as TFF's evaluation runs.
    client_state_arguments['evaluate_fn'] = per_client.evaluate_computation(
        info, loop, per_client.client_data_type(recipe, info), state_type,
        per_client.iterates(options))
  process = per_client.finish_process(
      initialize_fn, next_fn, state_type, info, recipe, process_class=process_class,
      execution=execution, in_process_next=in_process if execution.in_process else None,
      vectorized=vectorized, jit_compile=jit_compile, **client_state_arguments)
  process.recipe = recipe
  return process


def program_message_type(message_type, aggregation) -> tff.Type:
  """What the shard program receives: the round's message, and what the
  clients need of the aggregator's state (`client_params`) as 'aggregator'."""
  params_type = aggregation.client_params_type()
  if params_type is None:
    return message_type
  return tff.StructWithPythonType(
      list(tff.structure.iter_elements(message_type)) + [('aggregator', params_type)],
      collections.OrderedDict)


def program_message(recipe, aggregation, weights, stats, hparams, aggregator_state=None):
  message = model_info_lib.server_message(recipe, weights, stats, hparams)
  if aggregator_state is not None:
    message['aggregator'] = aggregation.client_params(aggregator_state)
  return message


def _message_computation(info, recipe, aggregation, aggregator_state_type) -> tff.Computation:
  """The server's message: `info.server_message_fn`, or with the aggregator's
  client params (taking the aggregator's state too) when it has any."""
  if aggregation.client_params_type() is None:
    return info.server_message_fn
  return tff.tensorflow.computation(
      lambda weights, stats, hparams, aggregator_state: program_message(
          recipe, aggregation, weights, stats, hparams, aggregator_state),
      info.weights_type, info.stats_type, layout.HPARAMS_TYPE, aggregator_state_type)


# The process classes (cohort_processes.py), under the names callers know them by.
CohortProcess = cohort_processes.CohortProcess
StatefulCohortProcess = cohort_processes.StatefulCohortProcess
PersonalizedCohortProcess = cohort_processes.PersonalizedCohortProcess
is_cohort = cohort_processes.is_cohort
