"""One federated round, assembled from an algorithm's math (a `Recipe`).

Every adaptive algorithm of the package has the same skeleton:

  server → clients:  x_t, broadcast(s_t), round hyperparameters (η_t, K_t)
  client i:          y_0 = x_t; local = init_local(broadcast(s_t), y_0)
                     for k < K_t:  g_k = ∇f(y_k; batch_k)
                                   local, y_{k+1} = local_step(local, y_k, g_k, η_t, k)
                     Δ_i = x_t − y_K;  extra_i = upload(local, g_0)
  clients → server:  Δ_i through `model_aggregator` (any `tff.aggregators`
                     factory: mean, DP, compression, robust), extra_i through a
                     mean with the same weights
  server:            x_{t+1}, s_{t+1} = server_update(x_t, s_t, Δ̄, extra, η_t, K_t)

A `Recipe` supplies those five TF functions; `build_process` wires them with
TFF intrinsics into a `tff.learning.templates.LearningProcess` (the round
engine's parts live in `tff_adaptive/rounds/`: client loop, server step and
costs, state layout, and two executions: per client on TFF's executor, or the
whole cohort as one compiled program) and measures,
from the TFF types of what is actually broadcast and aggregated, the bits each
client downloads and uploads, plus client SGD steps and FLOPs (docs/algorithms.md#costs). It is
TFF's `compose_learning_process` with one difference that adaptive algorithms
need: the clients receive server-side optimiser state, not only the model.

State and metrics have TFF's layout, so TFF programs (`train_model`,
checkpointing through `process.get_model_weights`, hparams) treat these
processes like TFF's own. The state is a
`tff.learning.templates.LearningAlgorithmState`:
  global_model_weights  x_t (`ModelWeights`),
  distributor           () (x_t and s_t go down in one broadcast, below),
  client_work           OrderedDict(learning_rate=η, local_steps=K): what
                        clients are told to run this round, like TFF's client
                        work state (its client optimiser's hyperparameters);
                        schedules change it between rounds,
  aggregator            `model_aggregator`'s state,
  finalizer             the recipe's server statistics s_t (for a server
                        optimiser: its state, so `finalizer['learning_rate']`
                        is η_s as in TFF's builders).
`process.get_hparams(state)` is OrderedDict(client_work=OrderedDict(
learning_rate, local_steps), finalizer=the server optimiser's hparams or an
empty OrderedDict); `set_hparams` writes them back. Metrics:
OrderedDict(distributor=(), client_work=OrderedDict(train=the model's
finalized metrics, first_minibatch_loss=mean over the sampled clients of the
loss on their first local minibatch), aggregator=`model_aggregator`'s
measurements, finalizer=(), cost=the measurements above[, client_drift]).

Design: TFF's `compose_learning_process` would give each component its own
intrinsics (a broadcast for the distributor, another for client work's
state, ...); a round here is one broadcast and one `federated_sum` (plus the
aggregator's own intrinsics when one is plugged in), measured to matter in
TFF's C++ executor (docs/performance.md). Only the containers are TFF's.
Like TFF's, the state keeps no round counter (the training loop counts). The
layout before TFF's (an OrderedDict of global_model_weights, stats,
aggregator, hparams, round_num) has one leaf more than this one, so a
checkpoint written with it is refused by `workflow.training.program` in one line
(`IncompatibleCheckpoint`), never loaded leaf by leaf into the wrong places.

Optionally (`measure_client_drift`), each round also reports client drift,
the FedGBO paper's Fig. 6.1 diagnostic (see `accounting/drift.py`).
"""

import contextvars
import dataclasses
import warnings
from collections.abc import Callable
from typing import Any, Optional, Union

import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.rounds import model_info
from tff_adaptive.rounds import options as options_lib
from tff_adaptive.rounds import per_client
from tff_adaptive.rounds import recipe as recipe_lib
from tff_adaptive.rounds import validation

Structure = Any
# The vocabulary of an algorithm module, which imports this module alone: its
# math (`Recipe`), the round's options (`RoundOptions`) and the model it takes.
# Everything else of the engine is named where it lives, in `rounds/`.
Recipe = recipe_lib.Recipe
RoundOptions = options_lib.RoundOptions
ModelFn = Union[Callable[[], tff.learning.models.VariableModel],
                tff.learning.models.FunctionalModel]


def build_process(
    model_fn: ModelFn,
    recipe: Recipe,
    *,
    client_learning_rate: float,
    local_steps: int,
    options: Optional[RoundOptions] = None,
    **option_keywords,
) -> tff.learning.templates.LearningProcess:
  """Builds the `LearningProcess` of `recipe`.

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel` (see `variable_model_fn`).
    recipe: the algorithm.
    client_learning_rate: initial η (`state.client_work['learning_rate']`;
      `process.set_hparams` or schedules change it).
    local_steps: initial K: clients run exactly K minibatch steps, cycling
      through their data (reshuffled by the dataset pipeline each pass); 0
      means one pass over the client dataset as preprocessed (E epochs).
    options: a `RoundOptions` (aggregation, measurement, execution).
    **option_keywords: or its fields as keywords (TFF's names:
      `client_weighting`, `model_aggregator`, ...; see `RoundOptions`).
  """
  if options is None:
    validation.check_weighting(option_keywords.get('client_weighting'),
                               option_keywords.get('model_aggregator'),
                               option_keywords.get('upload_compression'), recipe.name)
  options = _round_options(options, option_keywords, recipe.name)
  model_fn = variable_model_fn(model_fn, recipe.name)
  if local_steps < recipe.min_local_steps:
    raise errors.ArgumentError(recipe.name, 'local_steps', 'must be at least '
                               f'{recipe.min_local_steps}; got {local_steps}')
  info = model_info.ModelInfo(model_fn, recipe, options.fb_flops_per_example)
  kwargs = dict(client_learning_rate=client_learning_rate, local_steps=local_steps,
                options=options, info=info)
  if options.execution == 'per_client':
    built = Built(per_client.build(model_fn, recipe, **kwargs), recipe, 'per_client')
  else:
    built = _cohort_or_explained(model_fn, recipe, kwargs)
  recording = _recording.get()
  if recording is not None:
    recording.append(built)
  return built.process


def _cohort_or_explained(model_fn, recipe: Recipe, kwargs) -> 'Built':
  """The cohort process, or the per-client one with a one-line warning why; the
  reason is returned too, so a caller that reports it its own way (bin/train's
  start line) ignores `CohortDoesNotApply` and reads no text."""
  from tff_adaptive.rounds import cohort  # pylint: disable=g-import-not-at-top
  why = cohort.why_not(recipe, kwargs['options'], model_fn)
  if why is None:
    return Built(cohort.build(model_fn, recipe, **kwargs), recipe,
                 cohort.execution_of(kwargs['options']))
  warnings.warn(f'{recipe.name}: the cohort execution does not apply ({why}); the round '
                'runs per client', cohort.CohortDoesNotApply, stacklevel=3)
  return Built(per_client.build(model_fn, recipe, **kwargs), recipe, 'per_client', why)


@dataclasses.dataclass(frozen=True)
class Built:
  """A process `build_process` built, with its recipe and how its rounds run.

  Attributes:
    process: the `LearningProcess` (what `build_process` returns).
    recipe: the algorithm's `Recipe`; None for a process `build_process` did
      not build (`built_by`).
    execution: 'per_client', or the `cohort.CohortExecution` the rounds run as.
    why_per_client: why the rounds run per client although the cohort
      execution was asked for (the reason `cohort.CohortDoesNotApply` warns
      of); None when they run as asked.
  """
  process: tff.learning.templates.LearningProcess
  recipe: Optional[Recipe]
  execution: Any
  why_per_client: Optional[str] = None


# The `Built`s of the `build_process` calls within `built_by`, innermost call's.
_recording: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar(
    'tff_adaptive_built', default=None)


def built_by(build_fn: Callable[[], tff.learning.templates.LearningProcess]) -> Built:
  """What `build_fn()` builds, as a `Built`.

  `build_fn` is any builder with its arguments bound (`lambda:
  fedopt.build_fedopt(...)`): the builders keep TFF's shape (they return the
  process alone) and this says what they built beside it. A process that
  `build_process` did not build (another library's) comes back with no
  recipe, per client unless it is a cohort process.
  """
  recorded = []
  token = _recording.set(recorded)
  try:
    process = build_fn()
  finally:
    _recording.reset(token)
  for built in recorded:
    if built.process is process:
      return built
  from tff_adaptive.rounds import cohort  # pylint: disable=g-import-not-at-top
  return Built(process, None, process.execution if cohort.is_cohort(process) else 'per_client')


def _round_options(options: Optional[RoundOptions], keywords, name: str) -> RoundOptions:
  if options is not None and keywords:
    raise TypeError(f'pass either options= or option keywords, not both ({", ".join(keywords)})')
  if options is not None:
    return options
  keywords = {k: v for k, v in keywords.items() if v is not None}
  try:
    return RoundOptions(**keywords)
  except TypeError as e:
    if 'unexpected keyword' in str(e):
      raise TypeError(f'{name}: {e.args[0].split("() ")[-1]}; the options are the fields '
                      'of RoundOptions') from None
    raise TypeError(f'{name}: {e}') from None
  except ValueError as e:
    raise ValueError(f'{name}: {e}') from None


def variable_model_fn(model_fn: ModelFn, algorithm: str) -> Callable[[], tff.learning.models.VariableModel]:
  """`model_fn` as a no-arg callable returning a `VariableModel`.

  A `tff.learning.models.FunctionalModel` is wrapped with TFF's
  `model_from_functional`: the composer's client loop runs on variables (it
  assigns the broadcast weights and reads gradients of `forward_pass`), and the
  wrapper computes the same predictions and loss from the same initial
  weights. Its training metrics are TFF's wrapper's (`loss`, `num_examples`);
  the FunctionalModel's own metric functions are not carried over.
  """
  if isinstance(model_fn, tff.learning.models.FunctionalModel):
    functional_model = model_fn
    return lambda: tff.learning.models.model_from_functional(functional_model)
  if not callable(model_fn):
    raise TypeError(f'{algorithm}: model_fn must be a no-arg callable returning a '
                    'tff.learning.models.VariableModel, or a tff.learning.models.FunctionalModel; '
                    f'got {type(model_fn).__name__}')
  return validation.returning_a_model(model_fn, algorithm)
