"""FedAvg, FedAvgM, FedAdagrad, FedAdam and FedYogi (the FedOpt family).

Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 2.

  server → clients: x_t.
  client:           K steps (or E epochs) of the client optimiser from x_t,
                    its state started afresh every round (SGD in the paper:
                    y_k = y_{k−1} − η g_k); Δ_i = x_t − y_K.
  clients → server: Δ_i (and its weight w_i).
  server:           Δ̄ = Σ w_i Δ_i / Σ w_i;  x_{t+1} = ServerOpt(x_t, Δ̄).
  network per client: down |x|, up |x|.

`build_fedopt` is the one builder: TFF's `build_weighted_fed_avg` computed by
the package's round composer, equal to it to float tolerance with the same
optimisers (tested), plus the package's per-round costs, round-dependent η_t /
K_t (`process.set_hparams` or the round schedules) and exact-K local steps.
`build_fedavg` ... `build_fedyogi` name the server optimiser; its semantics
are TFF's as shipped (`semantics='tff'`) or the paper's Algorithm 2 exactly
(`semantics='paper'`, `tff_adaptive.optimizers.build_paper_adam` etc.).
"""

import collections
from collections.abc import Callable
import importlib
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms.names import (
    FEDOPT_ALGORITHM_SERVER_OPTIMIZER as ALGORITHM_SERVER_OPTIMIZER)
from tff_adaptive.algorithms.names import FEDOPT_SEMANTICS as SEMANTICS
from tff_adaptive.algorithms.server_optimizers import SERVER_OPTIMIZERS
from tff_adaptive.optimizers import adapters
from tff_adaptive.rounds import recipe as recipe_lib


def build_server_optimizer(name: str, learning_rate: float, *, semantics: str = 'tff',
                           beta_1: float = 0.9, beta_2: float = 0.99, tau: float = 1e-3,
                           initial_accumulator: Optional[float] = None,
                           momentum: float = 0.9) -> tff.learning.optimizers.Optimizer:
  """Server optimiser of docs/algorithms.md#fedopt under `tff` (as shipped) or `paper` semantics.

  `tff` semantics: TFF's optimisers as shipped (Adam/Yogi bias-corrected with ε =
  τ, Adagrad's ε inside the square root; `initial_accumulator` defaults to each
  TFF builder's own default). `paper` semantics: Algorithm 2 exactly
  (`tff_adaptive.optimizers.build_paper_{adagrad,adam,yogi}`). The names and
  their builders are the entries of `server_optimizers.SERVER_OPTIMIZERS`.
  """
  entry = SERVER_OPTIMIZERS.get(name)
  # A rule with one form (SGD, momentum) does not read the semantics.
  if (entry is None or entry.paper is not None) and semantics not in SEMANTICS:
    raise errors.ArgumentError('fedopt.build_server_optimizer', 'semantics',
                               f"must be 'tff' or 'paper'; got {semantics!r}")
  if entry is None:
    raise errors.ArgumentError('fedopt.build_server_optimizer', 'name',
                               f'must be one of {", ".join(SERVER_OPTIMIZERS)}; got {name!r}')
  builder = entry.paper if semantics == 'paper' and entry.paper else entry.tff
  given = dict(beta_1=beta_1, beta_2=beta_2, tau=tau, momentum=momentum,
               initial_accumulator=initial_accumulator)
  keywords = {keyword: given[hparam] for keyword, hparam in builder.keywords.items()
              if given[hparam] is not None}
  return _function(builder.function)(learning_rate, **keywords)


def _function(path: str) -> Callable[..., tff.learning.optimizers.Optimizer]:
  """The builder 'module:attribute.path' names."""
  module, attributes = path.split(':')
  found = importlib.import_module(module)
  for attribute in attributes.split('.'):
    found = getattr(found, attribute)
  return found


def fedopt_recipe(server_optimizer: tff.learning.optimizers.Optimizer,
                  client_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
                  ops_per_param: float = recipe_lib.DEFAULT_OPTIMIZER_OPS,
                  name: str = 'fedopt') -> composer.Recipe:
  """Client: `client_optimizer` from a fresh state each round (None: plain SGD)."""

  def init_stats(specs):
    return server_optimizer.initialize([tf.TensorSpec(s.shape, s.dtype) for s in specs])

  if client_optimizer is None:
    # Plain SGD keeps no client state: w − ηg directly, as TFF's SGD computes it.
    init_local = lambda b, y0: ()

    def local_step(local, y, grads, lr, step):
      del step
      return local, [w - lr * g for w, g in zip(y, grads)]
  else:
    def init_local(b, y0):
      del b
      return client_optimizer.initialize([tf.TensorSpec(w.shape, w.dtype) for w in y0])

    def local_step(local, y, grads, lr, step):
      del step
      return client_optimizer.next(with_learning_rate(local, lr), y, grads)

  return composer.Recipe(
      name=name, init_stats=init_stats, broadcast=lambda s: (),
      init_local=init_local, local_step=local_step,
      server_update=server_optimizer_update(server_optimizer),
      optimizer_ops_per_param=ops_per_param,
      get_server_hparams=server_optimizer.get_hparams,
      set_server_hparams=server_optimizer.set_hparams)


def with_learning_rate(state, lr):
  """An optimiser state with η of this round (client_work hparams) in place of its own."""
  state = collections.OrderedDict(state)
  state[tff.learning.optimizers.LEARNING_RATE_KEY] = tf.cast(lr, tf.float32)
  return state


def server_optimizer_update(server_optimizer: tff.learning.optimizers.Optimizer):
  """The composer's server step x ← server_optimizer(x, Δ̄) (FedOpt, FedAda2)."""

  def server_update(x, s, mean_delta, mean_extra, lr, local_steps):
    del mean_extra, lr, local_steps
    s, new_x = server_optimizer.next(s, x, mean_delta)
    return new_x, s

  return server_update


def build_fedopt(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    local_steps: int = 0,
    algorithm: str = 'fedopt',
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """FedOpt: any client optimiser, any server optimiser on Δ̄ (module docstring).

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel`.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` (the paper:
      `build_sgdm(η)`); its learning rate is the initial η
      (`state.client_work['learning_rate']`).
    server_optimizer_fn: default `build_sgdm(1.0)` (FedAvg).
    local_steps: K > 0: exactly K minibatch steps per client (cycling its
      data); 0: one pass over the client's dataset as given (E epochs).
    **options: `composer.RoundOptions` fields as keywords: TFF's
      `client_weighting`, `model_aggregator`, `metrics_aggregator`,
      `loop_implementation` (`model_distributor` is refused), and the
      package's `upload_compression`, `fb_flops_per_example`,
      `measure_client_drift`, `execution` ('per_client', 'cohort' or a
      `tff_adaptive.rounds.cohort.CohortExecution`).
    algorithm: the name in messages (`build_fedadam` etc. pass theirs).
  """
  model_fn = composer.variable_model_fn(model_fn, algorithm)
  info = adapters.describe(client_optimizer_fn, algorithm=algorithm)
  server_optimizer_fn = server_optimizer_fn or tff.learning.optimizers.build_sgdm(1.0)
  adapters.describe(server_optimizer_fn, algorithm=algorithm, role='server_optimizer_fn')
  client = None if info.kind == 'sgd' else client_optimizer_fn
  return composer.build_process(
      model_fn, fedopt_recipe(server_optimizer_fn, client, info.ops_per_param(moving=True),
                              name=algorithm),
      client_learning_rate=adapters.learning_rate(client_optimizer_fn, algorithm=algorithm),
      local_steps=local_steps, **options)


def _named(algorithm: str, server_name: str):
  def build(model_fn: composer.ModelFn, client_optimizer_fn: tff.learning.optimizers.Optimizer,
            server_learning_rate: float = 1.0, *, semantics: str = 'tff', beta_1: float = 0.9,
            beta_2: float = 0.99, tau: float = 1e-3, initial_accumulator: Optional[float] = None,
            momentum: float = 0.9, **kwargs: Any) -> tff.learning.templates.LearningProcess:
    server = build_server_optimizer(
        server_name, server_learning_rate, semantics=semantics, beta_1=beta_1, beta_2=beta_2,
        tau=tau, initial_accumulator=initial_accumulator, momentum=momentum)
    return build_fedopt(model_fn, client_optimizer_fn, server, algorithm=algorithm, **kwargs)

  build.__name__ = f'build_{algorithm}'
  build.__doc__ = (
      f'{algorithm}: `build_fedopt` with the server optimiser '
      f'`build_server_optimizer({server_name!r}, server_learning_rate, semantics=..., '
      'beta_1, beta_2, tau, initial_accumulator, momentum)`; other keywords go to '
      '`build_fedopt`.')
  return build


# build_fedavg, build_fedavgm, build_fedadagrad, build_fedadam, build_fedyogi: one per entry
# of SERVER_OPTIMIZERS, so that an added entry brings its own.
globals().update({f'build_{entry.algorithm}': _named(entry.algorithm, name)
                  for name, entry in SERVER_OPTIMIZERS.items()})
