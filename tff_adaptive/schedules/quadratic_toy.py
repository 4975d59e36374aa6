"""Seed 001 §3's quadratic toy as a TFF federated process.

"Faster Federated Learning with Decaying Number of Local SGD Steps" (seed 001),
§3 and Figure 1; SPEC §5. A one-parameter model x and clients with one
example z each, loss f(x; z) = ½ z x² − x (client minimiser 1/z), drawn from
p(z) ∝ z^(−1/2) on [1, 3]. The true minimiser of E_p[f] is 1/E_p[z] =
0.523373; K > 1 local GD steps with a constant client step γ move FedSGD's
fixed point to x̃*(γ, K) = E_p[(1−(1−γz)^K)/z] / E_p[1−(1−γz)^K]
(`schedules.quadratic_fixed_point`), and decaying K brings it back.

The clients are `schedules.quadratic_clients(n)` (equal-probability midpoint
clients in √z), so full participation with uniform weighting is the
deterministic expected FedSGD update; each client's "minibatch" is its one
example, so its K local steps are exact gradient descent.

The process is the package's own FedAvg/FedSGD (`fedopt.build_fedopt`, server SGD
with learning rate η), and K_t / γ_t reach it through `round_schedules`, the
same mechanism bin/train uses.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.schedules import driver as round_schedules
from tff_adaptive.schedules import core as schedules
from tff_adaptive.algorithms import fedopt

_INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 1], tf.float32), y=tf.TensorSpec([None, 1], tf.float32))


class QuadraticLoss(tf.keras.losses.Loss):
  """f(x; z) = ½ z x² − x, with the prediction x and the label z."""

  def call(self, y_true, y_pred):
    return tf.reduce_sum(0.5 * y_true * tf.square(y_pred) - y_pred, axis=-1)


def keras_model(x0: float = 0.4) -> tf.keras.Model:
  """x as the kernel of a bias-free Dense(1) applied to the constant input 1."""
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(1,)),
      tf.keras.layers.Dense(1, use_bias=False,
                            kernel_initializer=tf.keras.initializers.Constant(x0)),
  ])


def model_fn(x0: float = 0.4):
  return lambda: tff.learning.models.from_keras_model(
      keras_model(x0), loss=QuadraticLoss(), input_spec=_INPUT_SPEC)


def client_datasets(num_clients: int) -> list[tf.data.Dataset]:
  """One dataset of one example {x: 1, y: z_j} per client."""
  z, _ = schedules.quadratic_clients(num_clients)
  return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=np.ones([1, 1], np.float32), y=np.full([1, 1], zj, np.float32))).batch(1) for zj in z]


def build_process(gamma: float, k0: int, server_lr: float = 1.0, x0: float = 0.4):
  """FedSGD on the toy: client GD with step γ for K steps, server SGD with η."""
  return fedopt.build_fedopt(
      model_fn(x0), tff.learning.optimizers.build_sgdm(gamma),
      tff.learning.optimizers.build_sgdm(server_lr), local_steps=k0,
      client_weighting=tff.learning.ClientWeighting.UNIFORM)


def run(driver: round_schedules.RoundSchedules, num_rounds: int, *, gamma: float = 0.1,
        k0: int = 10, server_lr: float = 1.0, x0: float = 0.4, num_clients: int = 50,
        process=None) -> tuple[np.ndarray, list[dict[str, float]]]:
  """Runs `num_rounds` full-participation rounds; returns (x_0..x_R, metric rows).

  `driver` supplies K_t (and γ_t) exactly as in bin/train; `process` may be
  passed to reuse one built by `build_process(gamma, k0, server_lr, x0)`.
  """
  process = process or build_process(gamma, k0, server_lr, x0)
  data = client_datasets(num_clients)
  state = process.initialize()
  # The composer's state holds the weights as NumPy: read x without a TFF call.
  x_of = lambda s: float(np.asarray(s.global_model_weights.trainable[0]).reshape(-1)[0])
  xs = [x_of(state)]
  rows = []
  for round_num in range(1, num_rounds + 1):
    state, _, row = driver.apply(state, round_num)
    output = process.next(state, data)
    state = output.state
    row.update({f'cost/{k}': float(v) for k, v in output.metrics['cost'].items()})
    row[round_schedules.FIRST_MINIBATCH_LOSS] = float(
        output.metrics['client_work']['first_minibatch_loss'])
    row.update(driver.observe(round_num, row, num_clients))
    rows.append(row)
    xs.append(x_of(state))
  return np.asarray(xs), rows


def discrete_fixed_point(gamma: float, k: int, num_clients: int) -> float:
  """x̃*(γ, K) for the `num_clients` midpoint clients (the run's exact target)."""
  z, w = schedules.quadratic_clients(num_clients)
  a = 1.0 - (1.0 - gamma * z)**k
  return float(np.sum(w * a / z) / np.sum(w * a))


def driver_for(schedule: str, k0: int, *, decay: Optional[float] = None,
               gamma: float = 0.1, gamma_decay: Optional[float] = None,
               server_lr: Optional[float] = None,
               total_rounds: Optional[int] = None) -> round_schedules.RoundSchedules:
  """A driver from the same flags bin/train takes.

  Args:
    schedule: `--local_steps_schedule` (with `k0` = `--local_steps`, `decay` =
      `--local_steps_decay`).
    gamma, gamma_decay: `--client_learning_rate`; an `exp` client schedule
      with rate `gamma_decay` when given.
    server_lr: η_s written into the process state every round (an `exp`
      server schedule with rate 1), so one built process serves several η_s;
      None keeps the process's own.
    total_rounds: `--total_rounds` (validation only).
  """
  return round_schedules.from_config(dict(
      local_steps=k0, local_steps_schedule=schedule, local_steps_decay=decay,
      client_learning_rate=gamma, client_lr_schedule='exp' if gamma_decay else 'constant',
      client_lr_decay_rate=gamma_decay, server_learning_rate=server_lr,
      server_lr_schedule='constant' if server_lr is None else 'exp',
      server_lr_decay_rate=None if server_lr is None else 1.0, total_rounds=total_rounds))
