"""Mimelite, and the Mime recipe it shares with MimeXlite.

Karimireddy et al., "Breaking the centralized barrier for cross-device
federated learning" (Mime), NeurIPS 2021; a baseline of the FedGBO paper
(docs/algorithms.md#mimelite-and-mimexlite).

  server → clients: x_t and the base optimiser state s_t.
  client:           ∇f_i(x_t) = Σ_b n_b g_b / Σ_b n_b, the example-weighted
                    gradient at x_t over the batches the client trains on
                    (`extensions.full_gradient`: a pass before training);
                    K steps y_k = BaseOpt_{s_t}(y_{k−1}, g_k) with s_t FIXED
                    (the optimiser's new state is discarded); Δ_i = x_t − y_K.
  clients → server: Δ_i and ∇f_i(x_t) (2|x|).
  server:           x_{t+1} = ServerOpt(x_t, Δ̄); s_{t+1} = BaseOpt state after
                    one step with the weighted mean of ∇f_i(x_t).
  network per client: down |x| + |s|, up 2|x|.  FLOPs: 2·n·fb + K·C|x|.

With K local steps the client's data is cycled to exactly K batches and the
full gradient is over those K batches; with local_steps=0 it is one pass over
the client's dataset as given (E epochs: all local data). Per client this is
exactly TFF's `build_weighted_mime_lite` given the same batches (the same
floating-point order; tested); it also runs as a cohort program.

The state has the composer's layout (`composer.py`): the base optimiser
state is `state.finalizer['base']`, the server optimiser's
`state.finalizer['server']`, η is `state.client_work['learning_rate']`. A
checkpoint written by the former wrapper of TFF's builder (TFF's Mime state
layout) does not load: `workflow.training.program` refuses it in one line
(`IncompatibleCheckpoint`).
"""

import collections
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedopt
from tff_adaptive.extensions import first_gradient
from tff_adaptive.extensions import full_gradient
from tff_adaptive.optimizers import adapters

GRADIENTS = ('full', 'first')


def _with_learning_rate(state, lr):
  """`fedopt.with_learning_rate` for a base optimiser whose state has a learning rate
  (any other state is used as it is)."""
  if isinstance(state, dict) and tff.learning.optimizers.LEARNING_RATE_KEY in state:
    return fedopt.with_learning_rate(state, lr)
  return state


def mime_recipe(base_optimizer: tff.learning.optimizers.Optimizer,
                server_optimizer: tff.learning.optimizers.Optimizer, *,
                gradient: str = 'full', ops_per_param: float = 5.0,
                name: Optional[str] = None) -> composer.Recipe:
  """Mime's math. gradient='full': Mimelite's ∇f_i(x_t) over the client's
  batches; 'first': MimeXlite's gradient of the first local minibatch."""
  if gradient not in GRADIENTS:
    raise ValueError(f"mime: gradient must be 'full' or 'first'; got {gradient!r}")

  def init_stats(specs):
    specs = [tf.TensorSpec(s.shape, s.dtype) for s in specs]
    return collections.OrderedDict(base=base_optimizer.initialize(specs),
                                   server=server_optimizer.initialize(specs))

  def local_step(s, y, grads, lr, step):
    del step
    _, new_y = base_optimizer.next(_with_learning_rate(s, lr), y, grads)
    return s, new_y

  def server_update(x, stats, mean_delta, mean_gradient, lr, local_steps):
    del lr, local_steps
    server_state, new_x = server_optimizer.next(stats['server'], x, mean_delta)
    # TFF's Mime: the base optimiser steps "weights" of zeros; only its state is kept.
    base_state, _ = base_optimizer.next(stats['base'], [tf.zeros_like(g) for g in mean_gradient],
                                        list(mean_gradient))
    return new_x, collections.OrderedDict(base=base_state, server=server_state)

  return composer.Recipe(
      name=name or ('mimelite' if gradient == 'full' else 'mimexlite'),
      init_stats=init_stats, broadcast=lambda stats: stats['base'],
      init_local=lambda s, y0: s, local_step=local_step, server_update=server_update,
      upload=lambda s, g: list(g), optimizer_ops_per_param=ops_per_param,
      extensions=(full_gradient.FullGradient() if gradient == 'full'
                  else first_gradient.FirstGradient(),),
      get_server_hparams=lambda stats: collections.OrderedDict(
          server_optimizer.get_hparams(stats['server'])),
      set_server_hparams=lambda stats, hparams: collections.OrderedDict(
          base=stats['base'], server=server_optimizer.set_hparams(stats['server'], hparams)))


def build_mime(name: str, gradient: str, model_fn, client_optimizer_fn, server_optimizer_fn,
               *, local_steps: int, ops_per_param: Optional[float], options: dict):
  """Mimelite's and MimeXlite's process (their builders check their own arguments)."""
  info = adapters.describe(client_optimizer_fn, algorithm=name)
  learning_rate = adapters.learning_rate(client_optimizer_fn, algorithm=name)
  server_optimizer_fn = server_optimizer_fn or tff.learning.optimizers.build_sgdm(1.0)
  adapters.describe(server_optimizer_fn, algorithm=name, role='server_optimizer_fn')
  if ops_per_param is None:
    ops_per_param = info.ops_per_param(moving=False)
  if options.get('upload_compression') is not None:
    raise ValueError(f'{name}: upload_compression is not supported (the gradient it uploads '
                     'besides Δ is averaged uncompressed)')
  recipe = mime_recipe(client_optimizer_fn, server_optimizer_fn, gradient=gradient,
                       ops_per_param=ops_per_param, name=name)
  return composer.build_process(model_fn, recipe, client_learning_rate=learning_rate,
                                local_steps=local_steps, **options)


def build_mimelite(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    local_steps: int = 0,
    client_weighting: Optional[tff.learning.ClientWeighting] = None,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    full_gradient_aggregator=None,
    ops_per_param: Optional[float] = None,
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """Mimelite (see module docstring).

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel`.
    client_optimizer_fn: Mime's base optimiser, any
      `tff.learning.optimizers.Optimizer` with a `learning_rate`; its
      learning rate is the initial η, `state.client_work['learning_rate']`,
      which replaces the optimiser state's own at every local step (so
      schedules can change it).
    server_optimizer_fn: default `build_sgdm(1.0)`.
    local_steps: K: each client runs exactly K steps, cycling its data; 0
      (default): one pass over the client's dataset as given.
    client_weighting: default NUM_EXAMPLES; an unweighted `model_aggregator`
      averages Δ and the full gradients uniformly.
    model_aggregator: any `tff.aggregators` factory for Δ (weighted or
      unweighted).
    full_gradient_aggregator: only None: the full gradients are averaged with
      Δ's weights by the round's mean (TFF's default `MeanFactory`); any
      other value is a TypeError.
    ops_per_param: base-optimiser ops per parameter per step with fixed
      state; None: from the optimiser's kind (`adapters`).
    **options: the other `composer.RoundOptions` (`execution`,
      `measure_client_drift`, `fb_flops_per_example`, `metrics_aggregator`,
      `loop_implementation`, ...).
  """
  if full_gradient_aggregator is not None:
    raise TypeError('mimelite: full_gradient_aggregator is not supported: the full gradients '
                    "are averaged with Δ's weights by the round's mean (pass None)")
  if local_steps is None or local_steps < 0:
    raise errors.ArgumentError('mimelite', 'local_steps',
                               f'must be an integer ≥ 0; got {local_steps!r}')
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    if client_weighting not in (None, tff.learning.ClientWeighting.UNIFORM,
                                tff.learning.ClientWeighting.NUM_EXAMPLES):
      raise ValueError('mimelite: an unweighted model_aggregator averages uniformly; '
                       f'client_weighting={client_weighting} cannot apply')
    client_weighting = None  # the unweighted factory: uniform weights
  return build_mime('mimelite', 'full', model_fn, client_optimizer_fn, server_optimizer_fn,
                    local_steps=local_steps, ops_per_param=ops_per_param,
                    options=dict(options, client_weighting=client_weighting,
                                 model_aggregator=model_aggregator))
