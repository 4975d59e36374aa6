"""FedProx as a `Recipe`.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020.

  server → clients: x_t.
  client:           y_0 = x_t; K steps of the client optimiser (its state
                    started fresh each round) on g_k + μ(y_k − x_t), the
                    gradient of f_i(y) + (μ/2)‖y − x_t‖²; Δ_i = x_t − y_K.
  clients → server: Δ_i.
  server:           x_{t+1} = ServerOpt(x_t, Δ̄).
  network per client: down |x|, up |x|.  FLOPs: K(B·fb + (C + 3)|x|), C the
                    client optimiser's ops (SGD: 2; docs/algorithms.md#costs).

TFF's FedProx client (`build_weighted_fed_prox`, TFF 0.87) adds μ·(x_t − y),
the gradient of −(μ/2)‖y − x_t‖²: its proximal term pushes y away from x_t.
This recipe adds the paper's μ·(y − x_t), otherwise in TFF's floating-point
order (the optimiser step on g + term, no term at μ = 0), so that
`fedprox_recipe` with −μ equals TFF's builder with μ bit for bit, per client
(tested: TFF's sign, and ours pulling y towards x_t). It also runs as a
cohort program. Runs of the former wrapper of TFF's builder used TFF's sign. The client optimiser is any TFF optimiser whose
learning rate is replaced by the round's η (`state.client_work
['learning_rate']`, so schedules can change it).

The state has the composer's layout (`composer.py`); a checkpoint written by
the former wrapper of TFF's builder (TFF's FedProx state layout) does not
load: `workflow.training.program` refuses it in one line (`IncompatibleCheckpoint`),
as it refuses one written before μ joined `state.client_work`.
"""

import collections
import dataclasses
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedopt
from tff_adaptive.optimizers import adapters

# The proximal term's ops per parameter per step: y − x_t, ·μ, +.
PROXIMAL_OPS = 3


def fedprox_recipe(client_optimizer: tff.learning.optimizers.Optimizer,
                   server_optimizer: tff.learning.optimizers.Optimizer,
                   proximal_strength: float, ops_per_param: float) -> composer.Recipe:
  """FedProx's math; any real μ (`build_fedprox` requires μ ≥ 0; −μ is TFF's sign).

  μ is a client hyperparameter in the state (`state.client_work
  ['proximal_strength']`, sent with η and K), not a constant of the program, so
  that a population's members may differ in it.
  """

  def init_local(broadcast_value, y0):
    del broadcast_value
    specs = tuple(tf.TensorSpec(t.shape, t.dtype) for t in y0)
    return collections.OrderedDict(optimizer=client_optimizer.initialize(specs),
                                   anchor=tuple(y0))

  def local_step(local, y, grads, lr, step, proximal_strength):
    del step
    # As TFF's client, no term (not even + 0·…) at μ = 0; a select, not a branch,
    # since μ may differ between the lanes of a population's program.
    with_term = tf.not_equal(proximal_strength, 0.0)
    grads = [tf.where(with_term, g + proximal_strength * (w - x), g)
             for g, w, x in zip(grads, y, local['anchor'])]
    state, new_y = client_optimizer.next(
        fedopt.with_learning_rate(local['optimizer'], lr), tuple(y), tuple(grads))
    return collections.OrderedDict(optimizer=state, anchor=local['anchor']), new_y

  # FedOpt's server (its statistics, step and hparams); only the client differs.
  return dataclasses.replace(
      fedopt.fedopt_recipe(server_optimizer), name='fedprox', init_local=init_local,
      local_step=local_step, optimizer_ops_per_param=ops_per_param,
      client_hparams={'proximal_strength': float(proximal_strength)})


def build_fedprox(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    proximal_strength: float,
    local_steps: int = 0,
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """FedProx (module docstring).

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel`.
    client_optimizer_fn: a TFF optimiser with a `learning_rate` (the paper:
      `build_sgdm(η)`); its learning rate is the initial η.
    server_optimizer_fn: default `build_sgdm(1.0)`.
    proximal_strength: μ ≥ 0.
    local_steps: K: each client runs exactly K steps, cycling its data; 0
      (default): one pass over the client's dataset as given.
    **options: the `composer.RoundOptions` (`client_weighting`,
      `model_aggregator`, `upload_compression`, `execution`,
      `measure_client_drift`, `fb_flops_per_example` (None: counted from the
      model), `loop_implementation`, ...).
  """
  if proximal_strength < 0:
    raise errors.ArgumentError('fedprox', 'proximal_strength',
                               f'must be ≥ 0; got {proximal_strength}')
  if local_steps is None or local_steps < 0:
    raise errors.ArgumentError('fedprox', 'local_steps',
                               f'must be an integer ≥ 0; got {local_steps!r}')
  info = adapters.describe(client_optimizer_fn, algorithm='fedprox')
  learning_rate = adapters.learning_rate(client_optimizer_fn, algorithm='fedprox')
  server_optimizer_fn = server_optimizer_fn or tff.learning.optimizers.build_sgdm(1.0)
  adapters.describe(server_optimizer_fn, algorithm='fedprox', role='server_optimizer_fn')
  recipe = fedprox_recipe(client_optimizer_fn, server_optimizer_fn, proximal_strength,
                          info.ops_per_param(moving=True) + PROXIMAL_OPS)
  return composer.build_process(model_fn, recipe, client_learning_rate=learning_rate,
                                local_steps=local_steps, **options)
