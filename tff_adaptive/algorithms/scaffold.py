"""SCAFFOLD: stochastic controlled averaging, option II control variates.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", ICML 2020, Algorithm 1; the
baseline of the FedOpt paper (docs/algorithms.md#scaffold).

  state:            server model x, server control variate c (c_0 = 0);
                    every client i keeps c_i across rounds (0 until its
                    first round), N = the number of training clients.
  server → clients: x and c.
  client i:         y_0 = x;  y_k = y_{k−1} − η (g_k(y_{k−1}) − c_i + c),
                    k = 1..K_i (K steps, or one pass over its data);
                    option II:  c_i⁺ = c_i − c + (x − y_K) / (K_i η),
                    kept by the client (c_i ← c_i⁺).
  clients → server: Δy_i = x − y_K (as every algorithm here sends it) and
                    Δc_i = c_i⁺ − c_i.
  server:           x ← ServerOpt(x, mean_i Δy_i) (SGD with rate η_g:
                    x − η_g · mean_i Δy_i, the paper's step);
                    c ← c + (|S| / N) · mean_i Δc_i = c + (1/N) Σ_i Δc_i.
  network per client: down |x| + |c| = 2|x|, up 2|x| (+ η, K).

With the plain-SGD steps above, (x − y_K) / (K_i η) = mean_k g_k − c_i + c, so
c_i⁺ is the mean of the client's K_i minibatch gradients: computed that way
(no cancellation of x − y_K in float32; equal to the paper's formula, tested
against it in NumPy). Δy is averaged uniformly by default, as in the paper
(`client_weighting=NUM_EXAMPLES` weights it by examples, as the FedOpt paper weights
every method); Δc is always summed and divided by N, so c stays the mean of
all N clients' c_i. The clients' c_i enter and leave the round as
per-client data (`rounds.stateful.StatefulClientsProcess`; in the cohort
execution stacked in each shard and returned per client beside the round's
sums); the training loop keeps them in a `ClientStateStore`, checkpointed with
the server state.
"""

import collections
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.extensions import client_state
from tff_adaptive.optimizers import adapters

# Per parameter and step: g − c_i + c (1 add with c − c_i kept), y − η·(...)
# (2), the gradient sum for c_i⁺ (1).
OPTIMIZER_OPS = 4.0


def _zeros(specs):
  return tuple(tf.zeros(s.shape, s.dtype) for s in specs)


def scaffold_recipe(server_optimizer: tff.learning.optimizers.Optimizer,
                    total_clients: int) -> composer.Recipe:

  def init_stats(specs):
    return collections.OrderedDict(
        server=server_optimizer.initialize([tf.TensorSpec(s.shape, s.dtype) for s in specs]),
        control=_zeros(specs))

  def init_local(c, y0, c_i):
    del y0
    return collections.OrderedDict(
        correction=tuple(a - b for a, b in zip(c, c_i)), control=tuple(c_i),
        grad_sum=tuple(tf.zeros_like(t) for t in c_i), steps=tf.constant(0, tf.int32))

  def local_step(local, y, grads, lr, step):
    new_local = collections.OrderedDict(
        correction=local['correction'], control=local['control'],
        grad_sum=tuple(s + g for s, g in zip(local['grad_sum'], grads)), steps=step + 1)
    return new_local, [w - lr * (g + d) for w, g, d in zip(y, grads, local['correction'])]

  def new_control(local):
    # c_i⁺ = mean of the K_i gradients (module docstring); a client without a
    # step keeps c_i.
    steps = tf.cast(local['steps'], tf.float32)
    return tuple(tf.where(steps > 0, s / tf.maximum(steps, 1.0), c)
                 for s, c in zip(local['grad_sum'], local['control']))

  def upload(local, g0):
    del g0
    return tuple(n - c for n, c in zip(new_control(local), local['control']))

  def server_update(x, s, mean_delta, sum_control_delta, lr, local_steps):
    del lr, local_steps
    server, new_x = server_optimizer.next(s['server'], x, mean_delta)
    control = tuple(c + d / float(total_clients) for c, d in zip(s['control'], sum_control_delta))
    return new_x, collections.OrderedDict(server=server, control=control)

  return composer.Recipe(
      name='scaffold', init_stats=init_stats, broadcast=lambda s: s['control'],
      init_local=init_local, local_step=local_step, server_update=server_update, upload=upload,
      optimizer_ops_per_param=OPTIMIZER_OPS, weighting=tff.learning.ClientWeighting.UNIFORM,
      get_server_hparams=lambda s: server_optimizer.get_hparams(s['server']),
      set_server_hparams=lambda s, h: collections.OrderedDict(
          server=server_optimizer.set_hparams(s['server'], h), control=s['control']),
      sum_extra=True, extensions=(client_state.ClientState(_zeros, new_control),))


def build_scaffold(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    local_steps: int,
    total_clients: int,
    **options: Any,
):
  """SCAFFOLD (see module docstring): a `rounds.stateful.StatefulClientsProcess`.

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel`.
    client_optimizer_fn: `tff.learning.optimizers.build_sgdm(η)` without
      momentum: the clients' corrected SGD steps use its η (the initial
      `state.client_work['learning_rate']`); any other optimiser is refused.
    server_optimizer_fn: applied to mean Δy; default `build_sgdm(1.0)` (the
      paper's server step with η_g = 1).
    local_steps: K > 0 steps per client (cycling its data), or 0: one pass
      over the client's data as given (K_i = its number of batches).
    total_clients: N, the number of training clients (c's step is Σ Δc_i / N).
    **options: `composer.RoundOptions` fields as keywords: TFF's
      `client_weighting` (of Δy; default UNIFORM, the paper's),
      `model_aggregator` (for Δy), `metrics_aggregator`, `loop_implementation`
      (`model_distributor` is refused: x and c go down together), and
      `fb_flops_per_example`, `measure_client_drift`, `execution` ('cohort'
      or a `cohort.CohortExecution`: a `cohort.StatefulCohortProcess`, whose
      shards carry the clients' c_i, `process.with_client_states`).
      `upload_compression` is refused (Δc is summed).

  `next(state, client_data)` takes, per client, `process.client_input(dataset,
  c_i)` (c_i as `process.client_state_initial` lays it out: name → array) and
  returns the clients' c_i⁺ in `output.clients`.
  """
  if isinstance(total_clients, bool) or not isinstance(total_clients, int) or total_clients < 1:
    raise ValueError(f'scaffold: total_clients (N) must be a positive integer; got '
                     f'{total_clients!r}')
  if local_steps is None or local_steps < 0:
    raise errors.ArgumentError('scaffold', 'local_steps',
                               f'must be ≥ 0 (0: one pass); got {local_steps!r}')
  learning_rate = adapters.sgd_learning_rate(client_optimizer_fn, algorithm='scaffold')
  if server_optimizer_fn is None:
    server_optimizer_fn = tff.learning.optimizers.build_sgdm(1.0)
  adapters.describe(server_optimizer_fn, algorithm='scaffold', role='server_optimizer_fn')
  return composer.build_process(
      model_fn, scaffold_recipe(server_optimizer_fn, total_clients),
      client_learning_rate=learning_rate, local_steps=local_steps, **options)


def server_control(state) -> tuple:
  """c, the server control variate, of a SCAFFOLD state."""
  return tuple(state.finalizer['control'])
