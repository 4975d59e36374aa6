"""Execution 2: the whole cohort's round as one compiled program.

  next(state, client_data):      client datasets, or `cohort_data` padded shards
    shards = make_shards(each client's batches)    (datasets: cohort_next.py)
    message = (x_t, broadcast(s_t), (η, K))
    per shard, one TF program (cohort_program.py; the clients in sequence with
    tf.map_fn, or vectorised, each phase one tf.vectorized_map over the clients):
      for each client:
        carry = loop.before_steps(loop.init(x_t, broadcast), passes)  client.ClientLoop
        for each step with real rows:  g, loss = view.loss_and_grads(y, batch, mask)
                                       carry = loop.step(carry, g, loss, n, h)
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

Aggregation: each of the package's aggregators (`tff_adaptive.aggregators`:
the example-weighted or uniform mean, fused as per client; fixed-clip
Gaussian DP; CE-FedAvg upload compression; TFF's robust aggregator with
adaptive zeroing and clipping) has its program form, run by
`cohort_aggregation.py`: its client part per client inside the program, its
server part (the noise, the mean, the robust norms' next estimates) once per
round at the server. Robust's round norms go to the clients with the model
(the message's 'aggregator'). Aggregators without a program form (secure
aggregation, factories not built by this package), metrics aggregators and
models without a functional view run per client (`composer.build_process` warns
once, naming the reason, which `composer.built_by` returns as a value).
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
from tff_adaptive.rounds import cohort_data
from tff_adaptive.rounds import cohort_next
from tff_adaptive.rounds import cohort_program
from tff_adaptive.rounds import extension
from tff_adaptive.rounds import functional
from tff_adaptive.rounds import layout
from tff_adaptive.rounds import model_info as model_info_lib
from tff_adaptive.rounds import options as options_lib
from tff_adaptive.rounds import on_variables
from tff_adaptive.rounds import processes
from tff_adaptive.rounds import recipe as recipe_lib
from tff_adaptive.rounds import recurrent
from tff_adaptive.rounds import server as server_lib
from tff_adaptive.rounds import skeleton
from tff_adaptive.rounds import stateful

MODES = ('auto', 'vectorized', 'sequential')
JIT_COMPILE = (False, True, 'step', 'program', 'auto')


@dataclasses.dataclass(frozen=True)
class CohortExecution:
  """How the cohort program runs.

  Attributes:
    mode: 'vectorized' (clients in parallel, `tf.vectorized_map`; recurrent
      models with the client axis on their weights, lanes.py, or else
      unrolled), 'sequential' (`tf.map_fn`), or 'auto': sequential for
      models with convolutions (pfor runs their gradients as while loops:
      slower than in sequence, docs/performance.md) or recurrent layers
      without a lane form (unrolled, the Shakespeare GRU's program built in
      about 3.5 minutes and its round was no faster than in sequence with
      XLA), else vectorized (recurrent.vectorise).
    in_process: run the shard program as a `tf.function` in this process
      (single-machine simulation); False: through the current TFF context.
    num_shards: split the cohort into this many shards (e.g. one per TFF
      worker); None: by size, so that padding stays under `max_waste`.
    max_waste: see `cohort_data.group_by_size`.
    jit_compile: XLA. False: none. True or 'step': compile one client step
      (gradient, optimiser step, metrics; for vectorised recurrent models the
      whole cohort's step, cohort_program.py); it pays for recurrent models
      run in sequence, whose steps are many small ops (a GRU step of TFF's Shakespeare task:
      3x faster per round), small feed-forward models gain nothing.
      'program': compile the whole shard program (every client's every
      step) as one XLA computation: no per-op dispatch at all, which is
      most of a small model's step (the digits MLP: ~3x faster rounds,
      docs/performance.md); XLA compiles once per shard shape
      [clients, steps, rows], so it suits rounds of fixed shape (K local
      steps, a fixed cohort) and costs a compilation per new shape otherwise.
      'auto': none for recurrent models vectorised (XLA over their lanes'
      recurrence ran slower), 'step' for those in sequence, 'program' for
      fixed-K rounds (local_steps > 0) of models without convolutions, else
      none: the cases measured faster (docs/performance.md; a CNN under XLA
      was not).
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


def _unsupported_for(recipe: recipe_lib.Recipe, model_fn) -> Optional[str]:
  """Why the recipe's extensions keep the round from the cohort program (None: they don't)."""
  view = None
  for i, ext in enumerate(recipe.extensions):
    if type(ext).cohort_unsupported is extension.Extension.cohort_unsupported:
      continue
    view = view or functional.FunctionalView(model_fn)
    reason = ext.cohort_unsupported(view, recipe.extensions[:i] + recipe.extensions[i + 1:])
    if reason is not None:
      return reason
  return None


class CohortDoesNotApply(UserWarning):
  """The round runs per client although the cohort execution was asked for."""


def why_not(recipe: recipe_lib.Recipe, options: options_lib.RoundOptions,
            model_fn) -> Optional[str]:
  """Why this round cannot run as a cohort program (None: it can). The caller
  (`composer.build_process`) builds it per client then, and warns with
  `CohortDoesNotApply` naming the reason."""
  return unsupported_reason(options, model_fn) or _unsupported_for(recipe, model_fn)


def shard_type(element_type, client_state=None, inputs=()) -> tff.Type:
  """The TFF type of one shard: each batch leaf gains [clients, steps]
  dimensions; each leaf of the clients' state (a structure of tensors, for
  recipes whose clients keep one) a [clients] dimension. `inputs`: the names
  of the clients' other datasets (their test splits), padded alike."""
  batches = tff.types.type_to_tf_tensor_specs(element_type)
  batches = tf.nest.map_structure(
      lambda s: tf.TensorSpec([None, None, None] + list(s.shape[1:]), s.dtype), batches)
  fields = [('batches', tff.types.tensorflow_to_type(batches)),
            ('mask', tff.TensorType(np.float32, [None, None, None]))]
  fields += [(name, tff.StructWithPythonType(fields[:2], collections.OrderedDict))
             for name in inputs]
  if client_state is not None:
    stacked = tf.nest.map_structure(lambda t: tf.TensorSpec([None] + list(t.shape), t.dtype),
                                    client_state)
    fields.append(('client_state', tff.types.tensorflow_to_type(stacked)))
  return tff.StructWithPythonType(fields, collections.OrderedDict)


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


def resolved_jit_compile(jit_compile, view: functional.FunctionalView, local_steps: int,
                         vectorized: bool = False):
  """False, 'step' or 'program' for `CohortExecution.jit_compile` (see there)."""
  if jit_compile != 'auto':
    return 'step' if jit_compile is True else jit_compile
  if view.has_rnn:
    return recurrent.AUTO_JIT_COMPILE if vectorized else 'step'
  return 'program' if local_steps > 0 and not view.has_conv_or_rnn else False


def _traced(program: cohort_program.CohortProgram, xla: bool, message_type, data_type):
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


def _program(model_fn, recipe: recipe_lib.Recipe, options: options_lib.RoundOptions,
             info: model_info_lib.ModelInfo, local_steps: int):
  """(the shard program, what `CohortExecution.jit_compile` resolved to)."""
  execution = execution_of(options)
  # Keras' GRU/LSTM fast path recompiles at every XLA call (functional._generic_rnn).
  view = functional.FunctionalView(model_fn, generic_rnn=bool(execution.jit_compile))
  # Recurrent layers vectorise unrolled, or run in sequence (recurrent.py).
  vectorized = recurrent.vectorise(execution.mode, view, execution.jit_compile,
                                   recipe.extensions)
  view.unroll_rnn = vectorized and view.has_rnn and view.lane_model is None
  jit_compile = resolved_jit_compile(execution.jit_compile, view, local_steps, vectorized)
  loop = client_lib.ClientLoop(recipe, options.weighting_for(recipe), options.measure_client_drift,
                               branchless=vectorized)
  trainable_structure = client_lib.delta_structure(
      recipe, tff.types.type_to_tf_tensor_specs(info.weights_type.trainable),
      tff.types.type_to_tf_tensor_specs(info.weights_type.non_trainable))
  program = cohort_program.CohortProgram(
      view, loop, vectorized, trainable_structure, jit_compile=jit_compile == 'step',
      aggregation=cohort_aggregation.for_options(options, recipe))
  return program, jit_compile


def build(model_fn, recipe: recipe_lib.Recipe, *, client_learning_rate: float, local_steps: int,
          options: options_lib.RoundOptions, info: model_info_lib.ModelInfo):
  """The cohort `LearningProcess` (see module docstring)."""
  processes.check_client_state_options(recipe, options)
  execution = execution_of(options)
  program, jit_compile = _program(model_fn, recipe, options, info, local_steps)
  loop, vectorized, aggregation = program.loop, program.vectorized, program.aggregation
  stateful_clients = recipe.has_client_output
  client_state_arguments = (processes.client_state_arguments(recipe, info)
                            if stateful_clients else {})
  inputs = [name for ext in recipe.extensions for name, _ in ext.input_fields(info)]
  data_type = shard_type(info.element_type, client_state_arguments.get('client_state_structure')
                         if recipe.has_client_state else None, inputs)
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

  @tff.tensorflow.computation(info.weights_type, info.stats_type, info.hparams_type, sums_type)
  def server_round_fn(model_weights, stats, hparams, sums):
    return aggregation.server(server_round, model_weights, stats, hparams, sums)

  # The process the per-client round would aggregate with: its `initialize`
  # gives both executions the same state.
  process = aggregation.create(sums_type)
  initialize_fn = layout.initial_state_computation(
      info.model_fn, client_learning_rate, local_steps, process, info.init_stats,
      info.client_hparams)
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
  parts = cohort_next.RoundParts(
      message_fn=functools.partial(program_message, recipe, aggregation), program=program,
      traced_shard=traced, server_round=unfinalized, info=info, sums_type=sums_type,
      steps=steps, jit_compile=jit_compile)
  in_process = cohort_next.InProcessNext(next_fn, parts)
  process_class = StatefulCohortProcess if stateful_clients else CohortProcess
  if recipe.evaluates_clients:
    process_class = PersonalizedCohortProcess
    # Evaluations take every client: per client, as TFF's evaluation runs.
    client_state_arguments['evaluate_fn'] = on_variables.evaluate_computation(
        info, loop, processes.client_data_type(recipe, info), state_type,
        processes.iterates(options))
  return processes.finish_process(
      initialize_fn, next_fn, state_type, info, recipe,
      process_class=functools.partial(process_class, recipe=recipe),
      execution=execution, in_process_next=in_process if execution.in_process else None,
      vectorized=vectorized, jit_compile=jit_compile, round_parts=parts,
      **client_state_arguments)


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
      info.weights_type, info.stats_type, info.hparams_type, aggregator_state_type)


# The processes `build` returns: TFF learning processes whose `next` runs shard
# programs (padded shards, `make_shards`; in-process rounds, `cohort_next.py`).

class _CohortRounds:
  """What both cohort processes add to TFF's: padded shards, in-process rounds.

  `next(state, client_data)` (`cohort_next.CohortNext`) takes TFF's client
  datasets or `make_shards`' shards; it runs the shards in process when
  `execution.in_process`, else through the TFF computation `tff_next`, whose
  `type_signature` it has. `recipe` is the algorithm's `Recipe` the program
  runs, for tools that time or inspect its functions on their own;
  `round_parts` what the round is made of (`cohort_next.RoundParts`), for
  executions that run it in other forms (a population of runs).
  """
  stateful_clients = False

  def __init__(self, *args, recipe: recipe_lib.Recipe, execution, in_process_next,
               vectorized: bool, jit_compile, round_parts: cohort_next.RoundParts, **kwargs):
    super().__init__(*args, **kwargs)
    self.recipe = recipe
    self.round_parts = round_parts
    self.execution = execution
    self.vectorized = vectorized
    self.jit_compile = jit_compile  # what `execution.jit_compile` resolved to
    self.shard_stats = cohort_data.ShardStats()
    self._next = cohort_next.CohortNext(self, in_process_next or self.tff_next)

  @property
  def next(self) -> cohort_next.CohortNext:
    return self._next

  @property
  def tff_next(self) -> tff.Computation:
    return tff.templates.IterativeProcess.next.fget(self)

  def batches_per_client(self, local_steps: int) -> int:
    """What `cohort_data.client_batches` takes for K local steps: K × the
    recipe's `batches_per_step` (K <= 0, one pass: as given)."""
    return local_steps * self.recipe.batches_per_step if local_steps > 0 else local_steps

  def make_shards(self, client_batches, num_shards: Optional[int] = None) -> cohort_data.Shards:
    """Padded shards from each client's batches (`cohort_data.client_batches`).
    A recurrent cohort vectorised in this process takes one shard: its steps run
    only the lanes still training (cohort_program), so padding costs it nothing
    and more lanes share each op."""
    lanes = (self.vectorized and self.execution.in_process and
             cohort_program.steps_outside(self.round_parts.program.view))
    return cohort_data.shards(client_batches,
                              num_shards or self.execution.num_shards or (1 if lanes else None),
                              self.execution.max_waste, self.shard_stats)


class CohortProcess(_CohortRounds, tff.learning.templates.LearningProcess):
  """A `LearningProcess` whose `next` takes client datasets or padded shards."""


class StatefulCohortProcess(_CohortRounds, stateful.StatefulClientsProcess):
  """The cohort process of a recipe whose clients keep state (SCAFFOLD's c_i).

  `next(state, [process.client_input(dataset, state) for each client])`, as
  per client, or `next(state, process.with_client_states(shards, states))`
  with the sampled clients' stored states (`stateful.flat_state` form, in the
  order their batches were given to `make_shards`), returns their new states
  in `output.clients`, in that same order, as the per-client process does.
  """
  stateful_clients = True

  def with_client_states(self, shards: cohort_data.Shards, states) -> cohort_data.Shards:
    leaves = [[np.asarray(state[k]) for k in self.client_state_initial] for state in states]
    return cohort_data.with_client_states(shards, leaves, self._structure)

  def with_client_inputs(self, shards: cohort_data.Shards, client_data) -> cohort_data.Shards:
    """`shards` with what `client_input` gives each client besides its dataset."""
    return self.with_client_states(shards, [self.flat_state(e['private'])
                                            for e in client_data])

  def missing_inputs(self, shard) -> list[str]:
    return [] if 'client_state' in shard else ['client_state']


class PersonalizedCohortProcess(StatefulCohortProcess, stateful.PersonalizedClientsProcess):
  """The cohort process of a recipe whose clients measure user accuracy.

  `next(state, [process.client_input(train, client_state, test=test) ...])`
  as per client, or `next(state, process.with_client_inputs(shards, tests,
  states))`: `tests` are the clients' test batches
  (`cohort_data.client_batches(test, 0)`), in the order their training
  batches were given to `make_shards`; `states` their stored states (when the
  recipe keeps one). `evaluate_clients` runs per client.
  """

  def with_test_batches(self, shards, tests, states=None) -> cohort_data.Shards:
    shards = cohort_data.with_test_batches(shards, tests)
    return self.with_client_states(shards, states) if self.has_private_state else shards

  def with_client_inputs(self, shards, client_data) -> cohort_data.Shards:
    tests = [cohort_data.client_batches(e['test'], 0) for e in client_data]
    states = ([self.flat_state(e['private']) for e in client_data]
              if self.has_private_state else None)
    return self.with_test_batches(shards, tests, states)

  def missing_inputs(self, shard) -> list[str]:
    wanted = ['test'] + (['client_state'] if self.has_private_state else [])
    return [key for key in wanted if key not in shard]


def is_cohort(process) -> bool:
  """Whether `process` runs its rounds as cohort programs (`make_shards` applies)."""
  return isinstance(process, _CohortRounds)
