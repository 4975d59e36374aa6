"""FedAda2 and its baselines: joint server + client adaptivity.

Lee, Sharma, Zaheer, Li, "Efficient Adaptive Federated Optimization", arXiv:2410.18117,
2024; docs/algorithms.md#fedada2.

  server → clients: x_t; with `preconditioner='dja'` (direct joint
                    adaptivity) also the server's second moment v_t.
  client:           a client adaptive optimiser O_c (Adam, AdaGrad, SM3-Adam,
                    SM3-AdaGrad) whose state starts from v_t ('dja'; Adam
                    m_0 = 0) or from zero ('none'); K steps
                    y_k = O_c(y_{k−1}, g_k) with optional lr warm-up
                    η_k = η·min(1, k/10) over the first 10 steps;
                    Δ_i = x_t − y_K.
  clients → server: Δ_i.
  server:           x_{t+1} = ServerOpt(x_t, Δ̄), ServerOpt = Adam or AdaGrad
                    (optional momentum), FedOpt Algorithm-2 semantics.
  network per client: down |x| (+|x| for 'dja'), up |x|.
  client memory: the client optimiser state (Adam 2|x|, SM3-Adam |x| + Σ
                 covers, SM3-AdaGrad Σ covers).

FedAda2 itself is `preconditioner='none'` with an SM3 client optimiser: no
preconditioner is communicated and the client's second-moment memory is
sub-linear. DP: pass an unweighted DP factory as `model_aggregator`
(`tff_adaptive.aggregators.dp.dp_aggregator`; its (ε, δ):
`tff_adaptive.accounting.privacy`).
"""

import collections
import dataclasses
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms.names import FEDADA2_CLIENT_OPTIMIZERS as CLIENT_OPTIMIZERS
from tff_adaptive.algorithms.names import FEDADA2_PRECONDITIONERS as PRECONDITIONERS
from tff_adaptive.algorithms.names import FEDADA2_SERVER_OPTIMIZERS as SERVER_OPTIMIZERS
from tff_adaptive.optimizers import adapters
from tff_adaptive.optimizers import paper_fedopt
from tff_adaptive.optimizers import sm3

WARMUP_STEPS = 10


def build_client_optimizer(name: str, learning_rate: float, *, beta_1: float = 0.9,
                           beta_2: float = 0.999, epsilon: float = 1e-8,
                           sm3_variant: str = 'II', delay: int = 1,
                           bias_correction: bool = False) -> tff.learning.optimizers.Optimizer:
  if name not in CLIENT_OPTIMIZERS:
    raise errors.ArgumentError('fedada2.build_client_optimizer', 'name',
                               f'must be one of {", ".join(CLIENT_OPTIMIZERS)}; got {name!r}')
  if name.startswith('sm3') and delay < 1:
    raise errors.ArgumentError('fedada2.build_client_optimizer', 'delay',
                               f'must be ≥ 1; got {delay}')
  if name == 'adam':
    return paper_fedopt.build_paper_client_adam(learning_rate, beta_1=beta_1, beta_2=beta_2,
                                                epsilon=epsilon, bias_correction=bias_correction)
  if name == 'adagrad':
    return paper_fedopt.build_paper_client_adagrad(learning_rate, epsilon=epsilon)
  if name == 'sm3_adam':
    return sm3.build_sm3_adam(learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                              bias_correction=bias_correction, delay=delay)
  return sm3.build_sm3_adagrad(learning_rate, variant=sm3_variant, epsilon=epsilon, delay=delay)


def build_server_optimizer(name: str, learning_rate: float, *, beta_1: float = 0.9,
                           beta_2: float = 0.99, tau: float = 1e-3) -> tff.learning.optimizers.Optimizer:
  if name == 'adam':
    return paper_fedopt.build_paper_adam(learning_rate, beta_1=beta_1, beta_2=beta_2, tau=tau)
  if name == 'adagrad':  # the FedAda2 paper: v = Σ Δ̄² from 0, optional momentum β1
    return paper_fedopt.build_paper_adagrad(learning_rate, beta_1=beta_1, tau=tau,
                                            initial_accumulator_value=0.0)
  raise errors.ArgumentError('fedada2.build_server_optimizer', 'name',
                             f'must be one of {", ".join(SERVER_OPTIMIZERS)}; got {name!r}')


def fedada2_recipe(client_optimizer: tff.learning.optimizers.Optimizer,
                   server_optimizer: tff.learning.optimizers.Optimizer, *,
                   preconditioner: str = 'none', warmup: bool = False,
                   ops_per_param: float = 11.0) -> composer.Recipe:
  if preconditioner not in PRECONDITIONERS:
    raise errors.ArgumentError('fedada2', 'preconditioner',
                               f'must be one of {", ".join(PRECONDITIONERS)}; '
                               f'got {preconditioner!r}')
  if preconditioner == 'dja' and (isinstance(client_optimizer, sm3.SM3) or 'preconditioner' not in
                                  client_optimizer.initialize(())):
    raise errors.ArgumentError(
        'fedada2', 'preconditioner', 'needs a dense client optimiser (adam or adagrad): '
        f'{type(client_optimizer).__name__} has no per-coordinate v to start from', value='dja')

  def init_stats(specs):
    return server_optimizer.initialize([tf.TensorSpec(s.shape, s.dtype) for s in specs])

  def broadcast(server_state):
    return list(server_state['preconditioner']) if preconditioner == 'dja' else ()

  def init_local(server_v, y0):
    state = client_optimizer.initialize([tf.TensorSpec(w.shape, w.dtype) for w in y0])
    if preconditioner == 'dja':
      state = collections.OrderedDict(state)
      state['preconditioner'] = tuple(server_v)
    return state

  def local_step(state, y, grads, lr, step):
    if warmup:
      lr = lr * tf.minimum(1.0, tf.cast(step + 1, tf.float32) / WARMUP_STEPS)
    return client_optimizer.next(fedopt.with_learning_rate(state, lr), y, grads)

  # FedOpt's server step and hparams; the statistics, broadcast and client are FedAda2's.
  return dataclasses.replace(
      fedopt.fedopt_recipe(server_optimizer), name='fedada2', init_stats=init_stats,
      broadcast=broadcast, init_local=init_local, local_step=local_step,
      optimizer_ops_per_param=ops_per_param)


def build_fedada2(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    local_steps: int = 0,
    preconditioner: str = 'none',
    warmup: bool = False,
    ops_per_param: Optional[float] = None,
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """FedAda2 / DJA / no-PC (see module docstring).

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel`.
    client_optimizer_fn: the client adaptive optimiser, any
      `tff.learning.optimizers.Optimizer` with a `learning_rate`: SM3
      (`tff_adaptive.optimizers.build_sm3_adam`, `build_sm3_adagrad`; FedAda2
      itself), the paper-semantics client Adam/AdaGrad, or TFF's
      `build_adam`/`build_adagrad`/`build_rmsprop`/`build_sgdm`. Its learning
      rate is the initial η (`state.client_work['learning_rate']`, which the
      round writes into the optimiser state at every step, warm-up applied).
      'dja' needs a state with a dense `preconditioner` (Adam, AdaGrad).
    server_optimizer_fn: the server optimiser (the FedAda2 paper: paper-semantics Adam
      or AdaGrad, `build_server_optimizer`).
    local_steps: K > 0 steps, or 0 for one pass (epochs).
    preconditioner: 'none' (no-PC, FedAda2) or 'dja'.
    warmup: client lr warm-up over the first 10 local steps of each round.
    ops_per_param: client optimiser ops per parameter per step; None: from the
      optimiser's kind (`adapters`).
    Others: as `fedgbo.build_fedgbo`.
  """
  info = adapters.describe(client_optimizer_fn, algorithm='fedada2')
  learning_rate = adapters.learning_rate(client_optimizer_fn, algorithm='fedada2')
  adapters.describe(server_optimizer_fn, algorithm='fedada2', role='server_optimizer_fn')
  if ops_per_param is None:
    ops_per_param = info.ops_per_param(moving=True)
  return composer.build_process(
      model_fn, fedada2_recipe(client_optimizer_fn, server_optimizer_fn,
                               preconditioner=preconditioner, warmup=warmup,
                               ops_per_param=ops_per_param),
      client_learning_rate=learning_rate, local_steps=local_steps, **options)
