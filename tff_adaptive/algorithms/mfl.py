"""MFL: Momentum / adaptive Federated Learning with locally moving state.

Liu et al. 2020 ("Accelerating federated learning via momentum gradient
descent"); the FedGBO paper's baseline (docs/algorithms.md#mfl). With Adam this is
the thesis's FedAvg-Adam (ch. 3/4), the base of CE-FedAvg.

  server → clients: x_t and the optimiser state s_t.
  client:           (y_0, s^0) = (x_t, s_t); for k = 1..K an ordinary optimiser
                    step that moves both: s^k, d = O(s^{k−1}, g_k),
                    y_k = y_{k−1} − η d.  Δ_i = x_t − y_K.
  clients → server: Δ_i and s_i^K (for Adam: m, v and the step counter).
  server:           x_{t+1} = x_t − Σ w_i Δ_i;  s_{t+1} = Σ w_i s_i^K
                    (w_i ∝ examples by default; Adam's step counter is averaged).
  network per client: down |x| + |s|, up |x| + |s|.
"""

from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.algorithms import composer
from tff_adaptive.optimizers import adapters
from tff_adaptive.optimizers import biased as biased_optimizers


def mfl_recipe(optimizer: biased_optimizers.BiasedOptimizer,
               upload_state_deltas: bool = False) -> composer.Recipe:
  """`upload_state_deltas`: send s^K − s_t instead of s^K (same average; the
  deltas are what CE-FedAvg compresses)."""

  def init_local(s, y0):
    del y0  # s0 (for deltas) is extra client memory only when it is needed
    return {'s': s, 's0': s if upload_state_deltas else ()}

  def local_step(local, y, grads, lr, step):
    del step
    s, direction = optimizer.moving_step(local['s'], grads)
    return {'s': s, 's0': local['s0']}, [w - lr * d for w, d in zip(y, direction)]

  def upload(local, g0):
    del g0
    if not upload_state_deltas:
      return local['s']
    return tf.nest.map_structure(lambda a, b: a - b, local['s'], local['s0'])

  def server_update(x, s, mean_delta, mean_upload, lr, local_steps):
    del lr, local_steps
    new_s = (tf.nest.map_structure(lambda a, d: a + d, s, _like(s, mean_upload))
             if upload_state_deltas else mean_upload)
    return [w - d for w, d in zip(x, mean_delta)], new_s

  return composer.Recipe(
      name='mfl', init_stats=optimizer.init, broadcast=lambda s: s, init_local=init_local,
      local_step=local_step, server_update=server_update, upload=upload,
      optimizer_ops_per_param=optimizer.ops_moving)


def _like(reference, value):
  return tf.nest.pack_sequence_as(reference, tf.nest.flatten(value))


def build_mfl(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    local_steps: int = 0,
    bias_correction: bool = False,
    upload_state_deltas: bool = False,
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """MFL (see module docstring); `local_steps=0` runs epochs.

  `client_optimizer_fn` is read as for FedGBO (`adapters.to_biased`: TFF's
  `build_sgdm`, `build_rmsprop`, `build_adam`, `build_adagrad` or the
  paper-semantics Adam / client AdaGrad);
  its state moves on the clients (docs/algorithms.md#fedgbo table, m = 0, v = 1);
  `bias_correction` switches on Adam's bias correction. No server optimiser:
  x_{t+1} = x_t − Δ̄. Other arguments as `fedgbo.build_fedgbo`.
  """
  optimizer, learning_rate = adapters.to_biased(client_optimizer_fn, algorithm='mfl',
                                                bias_correction=bias_correction)
  return composer.build_process(
      model_fn, mfl_recipe(optimizer, upload_state_deltas),
      client_learning_rate=learning_rate, local_steps=local_steps, **options)
