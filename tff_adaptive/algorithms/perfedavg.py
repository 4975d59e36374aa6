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
"""

from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import fedopt
from tff_adaptive.optimizers import adapters
from tff_adaptive.personalization import process as personalized
from tff_adaptive.personalization import recipe as personal_recipe


def perfedavg_recipe(beta: float) -> personal_recipe.LocalRecipe:
  if not beta > 0:
    raise errors.ArgumentError('perfedavg', 'beta', f'must be > 0; got {beta}')

  def train_step(ctx, opt, batches, alpha, step):
    del step
    first, second = batches
    y = ctx.values()
    grads, _ = ctx.grad(first)
    ctx.assign([w - alpha * g for w, g in zip(y, grads)])
    meta_grads, _ = ctx.grad(second)  # first order: ∇f at ỹ, no Hessian term
    ctx.assign([w - beta * g for w, g in zip(y, meta_grads)])
    return opt

  def personalize(ctx, batch, alpha):
    grads, _ = ctx.grad(batch)
    ctx.assign([w - alpha * g for w, g in zip(ctx.values(), grads)])

  return personal_recipe.LocalRecipe(
      name='perfedavg_fo', train_step=train_step, personalize=personalize, batches_per_step=2,
      # Two SGD updates per meta-step.
      optimizer_ops_per_param=4.0)


def build_perfedavg(model_fn: Callable[[], tff.learning.models.VariableModel],
                    client_optimizer_fn: tff.learning.optimizers.Optimizer,
                    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None, *,
                    beta: float, local_steps: int = 0,
                    client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
                    fb_flops_per_example: Optional[float] = None) -> personalized.PersonalizedProcess:
  """Per-FedAvg (FO): α = the learning rate of `client_optimizer_fn`
  (`tff.learning.optimizers.build_sgdm(α)`: its inner steps are plain SGD),
  meta rate `beta`, K meta-steps; server default SGD(1)."""
  return personalized.build_personalized_process(
      model_fn, name='perfedavg', layout=personal_recipe.PatchLayout(),
      local=perfedavg_recipe(beta),
      server_optimizer=server_optimizer_fn or fedopt.build_server_optimizer('sgd', 1.0),
      client_learning_rate=adapters.sgd_learning_rate(client_optimizer_fn,
                                                      algorithm='perfedavg'), local_steps=local_steps,
      client_weighting=client_weighting, fb_flops_per_example=fb_flops_per_example,
      fingerprint={'beta': beta})
