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
"""

import collections
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import fedopt
from tff_adaptive.optimizers import adapters
from tff_adaptive.personalization import process as personalized
from tff_adaptive.personalization import recipe as personal_recipe


def pfedme_recipe(lam: float, personal_learning_rate: float,
                  inner_steps: int = 1) -> personal_recipe.LocalRecipe:
  if not lam > 0:
    raise errors.ArgumentError('pfedme', 'lam', f'must be > 0; got {lam}')
  if not personal_learning_rate > 0:
    raise errors.ArgumentError('pfedme', 'personal_learning_rate',
                               f'must be > 0; got {personal_learning_rate}')
  if inner_steps < 1:
    raise errors.ArgumentError('pfedme', 'inner_steps',
                               f'must be an integer ≥ 1; got {inner_steps}')

  def inner(ctx, batch, w):
    """K prox steps on `batch` from the current θ (in ctx) towards w."""
    for _ in range(inner_steps):
      grads, _ = ctx.grad(batch)
      ctx.assign([t - personal_learning_rate * (g + lam * (t - wi))
                  for t, g, wi in zip(ctx.values(), grads, w)])

  def init_optimizer(specs):
    # θ (the approximate personalised model), carried across the R steps.
    return collections.OrderedDict(theta=[tf.zeros(s.shape, s.dtype) for s in specs])

  def train_step(ctx, opt, batch, eta, step):
    w = ctx.values()
    # θ_0 = x_t (= w_0) in the first step of the round.
    theta = [tf.where(tf.equal(step, 0), wi, ti) for wi, ti in zip(w, opt['theta'])]
    ctx.assign(theta)
    inner(ctx, batch, w)
    theta = ctx.values()
    ctx.assign([wi - eta * lam * (wi - ti) for wi, ti in zip(w, theta)])
    return collections.OrderedDict(theta=tuple(theta))

  def personalize(ctx, batch, eta):
    del eta
    inner(ctx, batch, ctx.values())

  return personal_recipe.LocalRecipe(
      name='pfedme', train_step=train_step, init_optimizer=init_optimizer,
      personalize=personalize,
      # Per inner step ~4 ops per parameter, plus the w update.
      optimizer_ops_per_param=4.0 * inner_steps + 3.0)


def build_pfedme(model_fn: Callable[[], tff.learning.models.VariableModel],
                 client_optimizer_fn: tff.learning.optimizers.Optimizer,
                 server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None, *,
                 lam: float = 15.0, personal_learning_rate: float = 0.01, inner_steps: int = 1,
                 beta: float = 1.0, local_steps: int = 0,
                 client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
                 fb_flops_per_example: Optional[float] = None,
                 ) -> personalized.PersonalizedProcess:
  """pFedMe: η = the learning rate of `client_optimizer_fn` (`build_sgdm(η)`, the
  local w update is plain SGD), λ `lam`, η_p, K inner steps; server default SGD(β)."""
  if not beta > 0:
    raise errors.ArgumentError('pfedme', 'beta', f'must be > 0; got {beta}')
  return personalized.build_personalized_process(
      model_fn, name='pfedme', layout=personal_recipe.PatchLayout(),
      local=pfedme_recipe(lam, personal_learning_rate, inner_steps),
      server_optimizer=server_optimizer_fn or fedopt.build_server_optimizer('sgd', beta),
      client_learning_rate=adapters.sgd_learning_rate(client_optimizer_fn, algorithm='pfedme'),
      local_steps=local_steps,
      client_weighting=client_weighting, fb_flops_per_example=fb_flops_per_example,
      fingerprint={'lambda': lam, 'personal_learning_rate': personal_learning_rate,
                   'inner_steps': inner_steps, 'beta': beta})
