"""FedOpt as a composer recipe: client SGD, any `tff.learning.optimizers` server.

Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (seed 003), Alg. 2.

  server → clients: x_t.
  client:           K SGD steps (or E epochs): y_k = y_{k−1} − η g_k; Δ_i = x_t − y_K.
  clients → server: Δ_i.
  server:           Δ̄ = Σ w_i Δ_i / Σ w_i;  x_{t+1} = ServerOpt(x_t, Δ̄).
  network per client: down |x|, up |x|.

Equal, to float tolerance, to TFF's `build_weighted_fed_avg` with the same
optimisers (tested); running through the composer gives the FedOpt family the
package's per-round costs, round-dependent η_t / K_t and `model_aggregator`.
"""

from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.algorithms import composer


def fedopt_recipe(server_optimizer: tff.learning.optimizers.Optimizer) -> composer.Recipe:

  def init_stats(specs):
    return server_optimizer.initialize([tf.TensorSpec(s.shape, s.dtype) for s in specs])

  def local_step(local, y, grads, lr, step):
    del step
    return local, [w - lr * g for w, g in zip(y, grads)]

  def server_update(x, s, mean_delta, mean_extra, lr, local_steps):
    del mean_extra, lr, local_steps
    s, new_x = server_optimizer.next(s, x, mean_delta)
    return new_x, s

  return composer.Recipe(
      name='fedopt', init_stats=init_stats, broadcast=lambda s: (),
      init_local=lambda b, y0: (), local_step=local_step, server_update=server_update)


def build_fedopt_process(model_fn: Callable[[], tff.learning.models.VariableModel], *,
                         server_optimizer: tff.learning.optimizers.Optimizer,
                         client_learning_rate: float, local_steps: int = 0,
                         client_weighting: Optional[tff.learning.ClientWeighting] = None,
                         model_aggregator=None, upload_compression=None,
                         fb_flops_per_example: float = 0.0) -> tff.learning.templates.LearningProcess:
  """FedAvg/FedAvgM/FedAdagrad/FedAdam/FedYogi by `server_optimizer`."""
  return composer.build_process(
      model_fn, fedopt_recipe(server_optimizer), client_learning_rate=client_learning_rate,
      local_steps=local_steps, model_aggregator=model_aggregator,
      client_weighting=client_weighting, fb_flops_per_example=fb_flops_per_example,
      upload_compression=upload_compression)
