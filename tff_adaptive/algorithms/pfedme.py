"""pFedMe: personalised FL with Moreau envelopes (Dinh, Tran and Nguyen, NeurIPS 2020).

The personalised-FL baseline of thesis ch. 4 (thesis §4.2.4; docs/algorithms.md#mtfl),
the paper's Algorithm 1 with the thesis's sampling (only the sampled clients
train each round).

  client:  w_0 = θ_0 = x_t; for r < R (R = `local_steps`), one minibatch D_r:
             K inner steps  θ ← θ − η_p (∇f(θ; D_r) + λ (θ − w_r))
             (θ̃ ≈ argmin_θ f(θ; D_r) + λ/2 ‖θ − w_r‖², warm-started from the
             previous θ as in the authors' code)
             w_{r+1} = w_r − η λ (w_r − θ̃)
           Δ_i = x_t − w_R.
  server:  x_{t+1} = (1 − β) x_t + β Σ p_i w_R^i  =  x_t − β Σ p_i Δ_i.
  personalised model (UA, before local training): θ̂_i(x_t), the same K
  inner steps on the client's first training minibatch from θ = w = x_t —
  pFedMe's personalised model is θ̂_i(w) = prox_{f_i/λ}(w), and this computes
  it for the model being evaluated (no state is carried between rounds).
η is the client optimiser's learning rate (`state.client_work['learning_rate']`), η_p
`personal_learning_rate`. The authors'
optional weight decay (μ) is not part of Algorithm 1 and is left out.
network per client: down |x|, up |x|.

A `composer.Recipe` of the package's round engine: the engine's g of each
step is taken at θ and the other inner steps' through `grad_at`
(`extensions.more_gradients`), UA through `extensions.user_accuracy`; so it runs
per client and as a cohort.
"""

import collections
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


def pfedme_recipe(lam: float, personal_learning_rate: float, inner_steps: int = 1,
                  server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None
                  ) -> composer.Recipe:
  """pFedMe's client; server default SGD(1) (`build_pfedme` passes SGD(β))."""
  if not lam > 0:
    raise errors.ArgumentError('pfedme', 'lam', f'must be > 0; got {lam}')
  if not personal_learning_rate > 0:
    raise errors.ArgumentError('pfedme', 'personal_learning_rate',
                               f'must be > 0; got {personal_learning_rate}')
  if inner_steps < 1:
    raise errors.ArgumentError('pfedme', 'inner_steps',
                               f'must be an integer ≥ 1; got {inner_steps}')

  def prox_steps(theta, w, first_grads, grad_at):
    """K prox steps on the step's batch from θ towards w; the first at `first_grads`."""
    grads = first_grads
    for k in range(inner_steps):
      if k > 0:
        grads, _ = grad_at(theta, 0)
      theta = [t - personal_learning_rate * (g + lam * (t - wi))
               for t, g, wi in zip(theta, grads, w)]
    return theta

  def init_local(broadcast, y0):
    del broadcast
    # θ (the approximate personalised model), θ_0 = x_t, carried across the R steps.
    return collections.OrderedDict(theta=tuple(y0))

  def local_step(local, w, grads, eta, step, *, grad_at):
    del step
    theta = prox_steps(list(local['theta']), w, grads, grad_at)
    return (collections.OrderedDict(theta=tuple(theta)),
            [wi - eta * lam * (wi - ti) for wi, ti in zip(w, theta)])

  def personalize(x, eta, grad_at):
    del eta
    grads, _ = grad_at(x, 0)
    return prox_steps(list(x), list(x), grads, grad_at)

  recipe = fedopt.fedopt_recipe(server_optimizer or fedopt.build_server_optimizer('sgd', 1.0),
                                name='pfedme')
  return dataclasses.replace(
      recipe, init_local=init_local, local_step=local_step,
      # Per inner step ~4 ops per parameter, plus the w update.
      optimizer_ops_per_param=4.0 * inner_steps + 3.0,
      extensions=(more_gradients.MoreGradients(
                      gradient_at=lambda local, y: list(local['theta']),
                      passes_per_example=float(inner_steps)),
                  user_accuracy.UserAccuracy(personalize)))


def build_pfedme(model_fn: Callable[[], tff.learning.models.VariableModel],
                 client_optimizer_fn: tff.learning.optimizers.Optimizer,
                 server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None, *,
                 lam: float = 15.0, personal_learning_rate: float = 0.01, inner_steps: int = 1,
                 beta: float = 1.0, local_steps: int = 0, **options: Any):
  """pFedMe: η = the learning rate of `client_optimizer_fn` (`build_sgdm(η)`, the
  local w update is plain SGD), λ `lam`, η_p, K inner steps; server default SGD(β).

  `options`: `composer.RoundOptions` fields as keywords (`client_weighting`,
  `fb_flops_per_example`, `execution`). Returns a
  `rounds.stateful.PersonalizedClientsProcess` (or its cohort form), as
  `perfedavg.build_perfedavg`.
  """
  if not beta > 0:
    raise errors.ArgumentError('pfedme', 'beta', f'must be > 0; got {beta}')
  return composer.build_process(
      model_fn, pfedme_recipe(lam, personal_learning_rate, inner_steps,
                              server_optimizer_fn or fedopt.build_server_optimizer('sgd', beta)),
      client_learning_rate=adapters.sgd_learning_rate(client_optimizer_fn, algorithm='pfedme'),
      local_steps=local_steps, **options)
