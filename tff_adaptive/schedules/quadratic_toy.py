"""The decaying-K paper's quadratic toy (§3) as a TFF federated process.

"Faster Federated Learning with Decaying Number of Local SGD Steps" (the decaying-K paper),
§3 and Figure 1; docs/algorithms.md#schedules. A one-parameter model x and clients with one
example z each, loss f(x; z) = ½ z x² − x (client minimiser 1/z), drawn from
p(z) ∝ z^(−1/2) on [1, 3]. The true minimiser of E_p[f] is 1/E_p[z] =
0.523373 (`TRUE_MINIMISER`); K > 1 local GD steps with a constant client step γ
move FedSGD's fixed point to x̃*(γ, K) = E_p[(1−(1−γz)^K)/z] / E_p[1−(1−γz)^K]
(`fixed_point`), and decaying K brings it back.

The toy is here twice, on purpose: `simulate_fedsgd` runs it in NumPy (fast,
thousands of rounds, any participation), and `run` trains it as a TFF process.
Both use the same clients, `clients(n)` (equal-probability midpoint clients in
√z), so full participation with uniform weighting is the deterministic
expected FedSGD update; each client's "minibatch" is its one example, so its K
local steps are exact gradient descent.

The TFF process is the package's own FedAvg/FedSGD (`fedopt.build_fedopt`,
server SGD with learning rate η), and K_t / γ_t reach it through
`round_schedules`, the same mechanism bin/train uses.
"""

import collections
import math
from collections.abc import Callable
from typing import Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.algorithms import fedopt
from tff_adaptive.schedules import core as schedules
from tff_adaptive.schedules import driver as round_schedules
from tff_adaptive.schedules import learning_rate

# decaying-K paper §3: f(x; z) = z x**2 / 2 - x with z ~ p(z) proportional to z**(-1/2)
# on [1, 3].  With u = sqrt(z), p(z) dz is proportional to du: u is uniform on
# [1, sqrt(3)], which gives both quadratures below.

TRUE_MINIMISER = 3.0 * (math.sqrt(3.0) - 1.0) / (3.0 * math.sqrt(3.0) - 1.0)


def clients(num_clients: int) -> tuple[np.ndarray, np.ndarray]:
  """Deterministic clients for the toy: z_j and their probabilities.

  Midpoint rule in u = sqrt(z): z_j = u_j**2 with u_j the midpoints of
  `num_clients` equal cells of [1, sqrt(3)]; all clients are equally likely,
  so equal weights.  Each client holds one example z_j (decaying-K paper §3), hence
  its "minibatch" gradient is its full-batch gradient.
  """
  h = (math.sqrt(3.0) - 1.0) / num_clients
  u = 1.0 + h * (np.arange(num_clients) + 0.5)
  return u * u, np.full(num_clients, 1.0 / num_clients)


def fixed_point(gamma: float, k: int, num_nodes: int = 200) -> float:
  """The FedSGD fixed point x~*(gamma, K) of the toy, by Gauss-Legendre quadrature.

  K client GD steps from x give y_K - 1/z = (1 - gamma z)**K (x - 1/z), so the
  expected update E_p[(1 - (1 - gamma z)**K)(x - 1/z)] vanishes at
  x = E_p[(1 - (1 - gamma z)**K) / z] / E_p[1 - (1 - gamma z)**K]
  (Charles & Konecny's surrogate minimiser, decaying-K paper eqs. 4-7).  K = 1 gives
  1/E_p[z], the true minimiser.
  """
  nodes, weights = np.polynomial.legendre.leggauss(num_nodes)
  u = 1.0 + (math.sqrt(3.0) - 1.0) * (nodes + 1.0) / 2.0
  return _weighted_fixed_point(gamma, k, u * u, weights)


def _weighted_fixed_point(gamma: float, k: int, z: np.ndarray, weights: np.ndarray) -> float:
  """E[(1 − (1 − γz)^K) / z] / E[1 − (1 − γz)^K] over the points z with these weights."""
  a = 1.0 - (1.0 - gamma * z)**k
  return float(np.sum(weights * a / z) / np.sum(weights * a))


ScheduleLike = Union[schedules.Schedule, schedules.Number, Callable[[int], schedules.Number]]


def _schedule_fn(schedule: ScheduleLike, what: str) -> Callable[[int], schedules.Number]:
  if isinstance(schedule, schedules.Schedule):
    if schedule.feedback is not None:
      raise ValueError(f'{what}: feedback-driven schedules are not supported by the toy '
                       '(its losses are negative)')
    return schedule.value
  if callable(schedule):
    return schedule
  return lambda t: schedule


def simulate_fedsgd(local_steps: ScheduleLike, num_rounds: int, *,
                    gamma: ScheduleLike = 0.1, server_lr: float = 1.0,
                    x0: float = 0.4, num_clients: int = 1000,
                    clients_per_round: Optional[int] = None,
                    seed: int = 0) -> np.ndarray:
  """Runs FedSGD (decaying-K paper Algorithms 1-2) on the quadratic toy.

  Each participating client runs K_t explicit steps y <- y - gamma_t (z y - 1)
  on its single example; the server averages Delta = x - y_K with the clients'
  probabilities as weights (equal here) and sets x <- x - server_lr * Delta.

  Args:
    local_steps: K_t (a Schedule, an int, or a function of the round).
    num_rounds: rounds to run.
    gamma: client learning rate gamma_t (same kinds as `local_steps`).
    server_lr: eta (the decaying-K paper uses 0.001 with 10 sampled clients; 1 is FedAvg).
    x0: initial model (the decaying-K paper: 0.4).
    num_clients: number of quadrature clients (`clients`).
    clients_per_round: None for full participation (deterministic, the
      expected FedSGD update); else that many clients sampled uniformly
      without replacement each round, from `seed`.
    seed: sampling seed.

  Returns:
    x_0 .. x_{num_rounds}, shape [num_rounds + 1].
  """
  k_fn = _schedule_fn(local_steps, 'local_steps')
  gamma_fn = _schedule_fn(gamma, 'gamma')
  z_all, w_all = clients(num_clients)
  rng = np.random.default_rng(seed)
  xs = np.empty(num_rounds + 1)
  xs[0] = x = float(x0)
  for t in range(num_rounds):
    if clients_per_round is None:
      z, w = z_all, w_all
    else:
      idx = rng.choice(num_clients, size=clients_per_round, replace=False)
      z, w = z_all[idx], np.full(clients_per_round, 1.0 / clients_per_round)
    g = float(gamma_fn(t))
    y = np.full(z.shape, x)
    for _ in range(int(k_fn(t))):
      y -= g * (z * y - 1.0)
    x = x - server_lr * float(np.sum(w * (x - y)))
    xs[t + 1] = x
  return xs


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
  z, _ = clients(num_clients)
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
  return _weighted_fixed_point(gamma, k, *clients(num_clients))


def driver_for(local_steps: schedules.Schedule, *, gamma: float = 0.1,
               gamma_decay: Optional[float] = None,
               server_lr: Optional[float] = None) -> round_schedules.RoundSchedules:
  """A driver for `run`: K_t from `local_steps`, optionally γ_t and η_s.

  Args:
    local_steps: the K schedule (e.g. `learning_rate.ExponentialDecay(k0, d,
      quantity=schedules.LOCAL_STEPS)`).
    gamma, gamma_decay: the client learning rate γ; with `gamma_decay`, γ_t =
      γ · gamma_decay^t is written every round (else the process's own γ).
    server_lr: η_s written into the process state every round, so one built
      process serves several η_s; None keeps the process's own.
  """
  client_lr = (None if not gamma_decay else
               learning_rate.ExponentialDecay(gamma, gamma_decay, quantity=schedules.LEARNING_RATE))
  server = None if server_lr is None else schedules.ConstantSchedule(server_lr,
                                                                     schedules.LEARNING_RATE)
  return round_schedules.RoundSchedules(local_steps=local_steps, client_lr=client_lr,
                                        server_lr=server)
