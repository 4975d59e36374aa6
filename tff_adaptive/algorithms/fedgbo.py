"""FedGBO: Federated Global Biased Optimiser.

Mills, Hu, Min, "Accelerating Federated Learning with a Global Biased
Optimiser", IEEE Trans. Computers 2022 (also thesis ch. 6); docs/algorithms.md#fedgbo.

  server → clients: x_t and the global optimiser state s_t.
  client:           y_0 = x_t; y_k = y_{k−1} − η U(g_k, s_t), k = 1..K,
                    with s_t FIXED (no local state moves); Δ_i = x_t − y_K.
                    Variant `upload='average_gradient'`: also upload ḡ_i, the
                    mean of the client's K minibatch gradients.
  clients → server: Δ_i (|x|), plus ḡ_i (|x|) in the variant.
  server:           x_{t+1} = x_t − mean_i Δ_i (unweighted by default);
                    g̃_t = I(x_t, x_{t+1}, s_t, K, η)  (or mean ḡ_i in the variant);
                    s_{t+1} = T(g̃_t, s_t).
  network per client: down |x| + |s|, up |x| (2|x| in the variant).

The inverse step I recovers exactly the mean of all |S|·K minibatch
gradients of the round when aggregation is unweighted and every client runs
the same K (tested); `extensions.equal_local_steps` makes a round with unequal K fail.
The tracking is the server step of the recipe; clients' Δ go through any
`tff.aggregators` factory (`model_aggregator`).
"""

from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.extensions import equal_local_steps
from tff_adaptive.optimizers import adapters
from tff_adaptive.optimizers import biased as biased_optimizers

UPLOADS = ('model', 'average_gradient')


def fedgbo_recipe(optimizer: biased_optimizers.BiasedOptimizer,
                  upload: str = 'model') -> composer.Recipe:
  if upload not in UPLOADS:
    raise errors.ArgumentError('fedgbo', 'upload',
                               f'must be one of {", ".join(UPLOADS)}; got {upload!r}')
  average_gradient = upload == 'average_gradient'

  def init_local(s, y0):
    # s_t is fixed for the round: the client keeps only the parts of U that
    # depend on it (β1·m, √v + ε), computed once instead of at every step.
    # The variant also keeps a gradient sum.
    return {'factors': optimizer.fixed_factors(s),
            'grad_sum': [tf.zeros_like(w) for w in y0] if average_gradient else []}

  def local_step(local, y, grads, lr, step):
    del step
    direction = optimizer.fixed_direction_from(local['factors'], grads)
    grad_sum = ([a + g for a, g in zip(local['grad_sum'], grads)] if average_gradient
                else local['grad_sum'])
    return ({'factors': local['factors'], 'grad_sum': grad_sum},
            [w - lr * d for w, d in zip(y, direction)])

  def upload_fn(local, g0):
    del g0
    # The count of steps is uniform (equal_local_steps), so the server divides.
    return list(local['grad_sum'])

  def server_update(x, s, mean_delta, mean_extra, lr, local_steps):
    new_x = [w - d for w, d in zip(x, mean_delta)]
    if average_gradient:
      g_tilde = [g / tf.cast(local_steps, tf.float32) for g in mean_extra]
    else:
      g_tilde = optimizer.invert(s, mean_delta, lr, local_steps)
    return new_x, optimizer.track(s, g_tilde)

  return composer.Recipe(
      name='fedgbo', init_stats=optimizer.init, broadcast=lambda s: s, init_local=init_local,
      local_step=local_step, server_update=server_update,
      upload=upload_fn if average_gradient else None,
      optimizer_ops_per_param=optimizer.ops_fixed,
      extensions=(equal_local_steps.EqualLocalSteps(),),
      weighting=tff.learning.ClientWeighting.UNIFORM)


def build_fedgbo(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    local_steps: int,
    upload: str = 'model',
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """FedGBO (see module docstring).

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel`.
    client_optimizer_fn: the global biased optimiser, named by a TFF optimiser
      whose kind and hyperparameters are read (`adapters.to_biased`):
      `tff.learning.optimizers.build_sgdm(η, momentum=β)` (SGDm; no momentum:
      FedAvg), `build_rmsprop(η, decay=β, epsilon=ε)`, `build_adam(η, beta_1,
      beta_2, epsilon)`, `build_adagrad(η, initial_preconditioner_value,
      epsilon)` or the package's paper-semantics Adam / client AdaGrad. The
      table of docs/algorithms.md#fedgbo applies
 (m = 0, v = 1, no bias correction; AdaGrad: see
      `biased`); η is the initial `state.client_work['learning_rate']`.
      Others (Yogi, SM3, ...) are refused with a ValueError.
    local_steps: K, identical for every client (required).
    upload: 'model' (the paper's default) or 'average_gradient'.
    **options: `composer.RoundOptions` fields as keywords: TFF's
      `client_weighting`, `model_aggregator`, `metrics_aggregator`,
      `loop_implementation` (`model_distributor` is refused), and the
      package's `upload_compression`, `fb_flops_per_example`,
      `measure_client_drift`, `execution` ('per_client', 'cohort' or a
      `tff_adaptive.rounds.cohort.CohortExecution`).

  FedGBO has no server optimiser (x_{t+1} = x_t − Δ̄), so no
  `server_optimizer_fn`.
  """
  if not local_steps or local_steps < 1:
    raise errors.ArgumentError('fedgbo', 'local_steps', 'must be an integer ≥ 1 (FedGBO runs '
                               f'exactly K local steps per client); got {local_steps!r}')
  optimizer, learning_rate = adapters.to_biased(client_optimizer_fn, algorithm='fedgbo')
  return composer.build_process(
      model_fn, fedgbo_recipe(optimizer, upload), client_learning_rate=learning_rate,
      local_steps=local_steps, **options)
