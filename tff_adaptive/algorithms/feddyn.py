"""FedDyn: federated learning with dynamic regularisation.

Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning Based on
Dynamic Regularization", ICLR 2021, Algorithm 1 (docs/algorithms.md#feddyn).

  state:            server model x, h (h_0 = 0); every client k keeps
                    λ_k = ∇L_k(θ_k) of the paper (0 until its first round),
                    m = the number of training clients.
  server → clients: x.
  client k:         θ_k ≈ argmin_θ L_k(θ) − ⟨λ_k, θ⟩ + α/2 ‖θ − x‖², by K
                    SGD steps from y_0 = x on the local objective:
                    y ← y − η (g(y) − λ_k + α (y − x));
                    λ_k⁺ = λ_k − α (y_K − x), kept by the client.
  clients → server: Δ_k = x − y_K (as every algorithm here sends it), and a
                    1 that the server sums into |P_t| (32 bits).
  server:           h ← h − (α/m) Σ_{k∈P} (θ_k − x) = h + α (|P|/m) mean_k Δ_k;
                    x ← mean_k θ_k − h/α = x − mean_k Δ_k − h/α.
  network per client: down |x|, up |x| + 1 (+ η, K).

The client folds λ_k and x into one tensor, s = λ_k + α x: its step is
y − η (g + α y − s) and λ_k⁺ = s − α y_K, so it holds |x| floats besides
the model during the round. Δ is averaged uniformly by default (the paper's
mean over P_t); a client whose update is not finite is dropped from the mean
and from |P_t| and keeps its λ_k.
"""

import collections
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.extensions import client_state
from tff_adaptive.optimizers import adapters

# The middle of the paper's grid for α, {0.1, 0.01, 0.001} (its §5).
DEFAULT_ALPHA = 0.01
# Per parameter and step: α·y (1), g + α y − s (2), y − η·(...) (2).
OPTIMIZER_OPS = 5.0


class LinearTerm(client_state.ClientState):
  """λ_k⁺ = s − α y_K: the client's new state reads its last weights."""

  def __init__(self, alpha: float):
    zeros = lambda specs: tuple(tf.zeros(s.shape, s.dtype) for s in specs)
    super().__init__(zeros, update=None)
    self.alpha = alpha

  def new_state(self, carry):
    return tuple(s - self.alpha * y for s, y in zip(carry['local']['shift'], carry['y']))


def feddyn_recipe(alpha: float, total_clients: int) -> composer.Recipe:

  def init_local(broadcast, y0, lam):
    del broadcast
    return collections.OrderedDict(shift=tuple(l + alpha * x for l, x in zip(lam, y0)))

  def local_step(local, y, grads, lr, step):
    del step
    return local, [w - lr * (g + alpha * w - s) for w, g, s in zip(y, grads, local['shift'])]

  def server_update(x, s, mean_delta, participants, lr, local_steps):
    del lr, local_steps
    h = tuple(hi + (alpha * participants / float(total_clients)) * d
              for hi, d in zip(s['h'], mean_delta))
    return ([w - d - hi / alpha for w, d, hi in zip(x, mean_delta, h)],
            collections.OrderedDict(h=h))

  return composer.Recipe(
      name='feddyn',
      init_stats=lambda specs: collections.OrderedDict(
          h=tuple(tf.zeros(s.shape, s.dtype) for s in specs)),
      broadcast=lambda s: (), init_local=init_local, local_step=local_step,
      server_update=server_update, upload=lambda local, g: tf.constant(1.0), sum_extra=True,
      optimizer_ops_per_param=OPTIMIZER_OPS, weighting=tff.learning.ClientWeighting.UNIFORM,
      extensions=(LinearTerm(alpha),))


def build_feddyn(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    alpha: float = DEFAULT_ALPHA,
    local_steps: int,
    total_clients: int,
    **options: Any,
):
  """FedDyn (see module docstring), whose clients keep λ_k between rounds.

  Args:
    model_fn: as every builder's (a no-arg `VariableModel` callable, or a
      `FunctionalModel`).
    client_optimizer_fn: plain SGD, `tff.learning.optimizers.build_sgdm(η)`;
      η is the initial `state.client_work['learning_rate']` of the local
      objective's steps.
    alpha: α > 0, the dynamic regulariser's strength.
    local_steps: K > 0 steps per client (cycling its data), or 0: one pass
      over the client's data as given.
    total_clients: m, the number of training clients (h's step is α/m Σ).
    **options: `composer.RoundOptions` fields as keywords: `client_weighting`
      (default UNIFORM, the paper's mean over P_t), `model_aggregator`,
      `metrics_aggregator`, `loop_implementation`, `fb_flops_per_example`,
      `measure_client_drift`, `execution` ('cohort' or a
      `cohort.CohortExecution`: a `cohort.StatefulCohortProcess`).
      `upload_compression` is refused (the count is summed).

  Returns a `rounds.stateful.StatefulClientsProcess`: `next(state, inputs)`
  takes `process.client_input(dataset, λ_k)` per client and gives back the
  clients' λ_k⁺ in `output.clients`.
  """
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
    raise errors.ArgumentError('feddyn', 'alpha', f'must be a number > 0; got {alpha!r}')
  if isinstance(total_clients, bool) or not isinstance(total_clients, int) or total_clients < 1:
    raise ValueError(f'feddyn: total_clients (m) must be a positive integer; got '
                     f'{total_clients!r}')
  # local_steps < 0 is refused by `composer.build_process`, naming it.
  learning_rate = adapters.sgd_learning_rate(client_optimizer_fn, algorithm='feddyn')
  return composer.build_process(
      model_fn, feddyn_recipe(float(alpha), total_clients),
      client_learning_rate=learning_rate, local_steps=local_steps, **options)


def server_h(state) -> tuple:
  """h, the server's accumulated correction, of a FedDyn state."""
  return tuple(state.finalizer['h'])

