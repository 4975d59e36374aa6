"""Per-FedAvg, first-order (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020).

The personalised-FL baseline of thesis ch. 4 (thesis §4.2.4; docs/algorithms.md#mtfl),
first-order variant (FO, the paper's §5 (i)), as in the thesis's experiments.

  client:  from y_0 = x_t, K meta-steps, each on two fresh minibatches D, D':
             ỹ = y − α ∇f(y; D);   y ← y − β ∇f(ỹ; D')
           Δ_i = x_t − y_K.
  server:  x_{t+1} = x_t − η_s Σ w_i Δ_i (η_s = 1: the average).
  personalised model (UA, measured before local training): ONE SGD step of
  size α on ONE minibatch of the client's training data from x_t:
           x_t − α ∇f(x_t; D_1).
α is the client optimiser's learning rate (the round hparam
`state.client_work['learning_rate']`), β `beta`.
network per client: down |x|, up |x| (no private state).

A `composer.Recipe` of the package's round engine: a meta-step takes two
batches and ∇f(ỹ; D') comes from the engine's `grad_at`
(`extensions.more_gradients`), UA from `extensions.user_accuracy`, so
it runs per client and as a cohort.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional

import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedopt
from tff_adaptive.extensions import more_gradients
from tff_adaptive.extensions import user_accuracy
from tff_adaptive.optimizers import adapters


def perfedavg_recipe(beta: float,
                     server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None
                     ) -> composer.Recipe:
  """Per-FedAvg (FO): the engine's g is ∇f(y; D); ∇f(ỹ; D') through `grad_at`;
  server default SGD(1)."""
  if not beta > 0:
    raise errors.ArgumentError('perfedavg', 'beta', f'must be > 0; got {beta}')

  def local_step(local, y, grads, alpha, step, *, grad_at):
    del step
    y_tilde = [w - alpha * g for w, g in zip(y, grads)]
    meta_grads, _ = grad_at(y_tilde, 1)  # first order: ∇f at ỹ, no Hessian term
    return local, [w - beta * g for w, g in zip(y, meta_grads)]

  def personalize(x, alpha, grad_at):
    grads, _ = grad_at(x, 0)
    return [w - alpha * g for w, g in zip(x, grads)]

  return dataclasses.replace(
      fedopt.fedopt_recipe(server_optimizer or fedopt.build_server_optimizer('sgd', 1.0),
                           name='perfedavg'), local_step=local_step,
      # Two SGD updates per meta-step.
      optimizer_ops_per_param=4.0,
      extensions=(more_gradients.MoreGradients(batches_per_step=2),
                  user_accuracy.UserAccuracy(personalize)))


def build_perfedavg(model_fn: Callable[[], tff.learning.models.VariableModel],
                    client_optimizer_fn: tff.learning.optimizers.Optimizer,
                    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None, *,
                    beta: float, local_steps: int = 0, **options: Any):
  """Per-FedAvg (FO): α = the learning rate of `client_optimizer_fn`
  (`tff.learning.optimizers.build_sgdm(α)`: its inner steps are plain SGD),
  meta rate `beta`, K meta-steps (2K minibatches; 0: one pass, in pairs of
  batches); server default SGD(1).

  `options`: `composer.RoundOptions` fields as keywords (`client_weighting`,
  `fb_flops_per_example`, `execution`: 'cohort' or a `cohort.CohortExecution`).
  Returns a `rounds.stateful.PersonalizedClientsProcess` (per client) or a
  `cohort.PersonalizedCohortProcess`: per client, `process.client_input(train,
  test=test)`; `output.clients[i]['ua']` is the client's user accuracy.
  """
  return composer.build_process(
      model_fn, perfedavg_recipe(beta, server_optimizer_fn),
      client_learning_rate=adapters.sgd_learning_rate(client_optimizer_fn,
                                                      algorithm='perfedavg'),
      local_steps=local_steps, **options)
