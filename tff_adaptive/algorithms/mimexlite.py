"""MimeXlite: Mimelite whose "full" gradient is one minibatch gradient.

Karimireddy et al., "Breaking the centralized barrier for cross-device
federated learning" (Mime), NeurIPS 2021; the cheaper variant of the FedGBO paper
(docs/algorithms.md#mimelite-and-mimexlite). Mimelite
 itself is TFF's (`mimelite.py` wraps it).

  server → clients: x_t and the base optimiser state s_t.
  client:           g_0 = ∇f(x_t; first minibatch)  (one minibatch, not n_i);
                    K steps y_k = BaseOpt_{s_t}(y_{k−1}, g_k) with s_t FIXED
                    (the optimiser's new state is discarded, as in TFF's Mime);
                    Δ_i = x_t − y_K.
  clients → server: Δ_i and g_0 (2|x|).
  server:           x_{t+1} = ServerOpt(x_t, Δ̄);  s_{t+1} = BaseOpt state after
                    one step with the weighted mean of g_0.
  network per client: down |x| + |s|, up 2|x|.

g_0 is the gradient of the first local step, so the extra minibatch costs no
extra forward/backward pass here; with K = 1 and a one-batch dataset this is
exactly TFF's Mimelite (tested).
"""

import collections
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.algorithms import composer
from tff_adaptive.optimizers import adapters


def _with_learning_rate(state, lr):
  if isinstance(state, dict) and 'learning_rate' in state:
    state = collections.OrderedDict(state)
    state['learning_rate'] = tf.cast(lr, tf.float32)
  return state


def mimexlite_recipe(base_optimizer: tff.learning.optimizers.Optimizer,
                     server_optimizer: tff.learning.optimizers.Optimizer,
                     ops_per_param: float = 5.0) -> composer.Recipe:

  def init_stats(specs):
    specs = [tf.TensorSpec(s.shape, s.dtype) for s in specs]
    return collections.OrderedDict(base=base_optimizer.initialize(specs),
                                   server=server_optimizer.initialize(specs))

  def local_step(s, y, grads, lr, step):
    del step
    _, new_y = base_optimizer.next(_with_learning_rate(s, lr), y, grads)
    return s, new_y

  def server_update(x, stats, mean_delta, mean_g0, lr, local_steps):
    del lr, local_steps
    server_state, new_x = server_optimizer.next(stats['server'], x, mean_delta)
    base_state, _ = base_optimizer.next(stats['base'], [tf.zeros_like(g) for g in mean_g0],
                                        list(mean_g0))
    return new_x, collections.OrderedDict(base=base_state, server=server_state)

  return composer.Recipe(
      name='mimexlite', init_stats=init_stats, broadcast=lambda stats: stats['base'],
      init_local=lambda s, y0: s, local_step=local_step, server_update=server_update,
      upload=lambda s, g0: list(g0), optimizer_ops_per_param=ops_per_param,
      uses_first_gradient=True,
      get_server_hparams=lambda stats: collections.OrderedDict(
          server_optimizer.get_hparams(stats['server'])),
      set_server_hparams=lambda stats, hparams: collections.OrderedDict(
          base=stats['base'], server=server_optimizer.set_hparams(stats['server'], hparams)))


def build_mimexlite(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    local_steps: int,
    ops_per_param: Optional[float] = None,
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """MimeXlite (see module docstring).

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel`.
    client_optimizer_fn: Mime's base optimiser, any
      `tff.learning.optimizers.Optimizer` with a `learning_rate` (TFF's, the
      paper-semantics or SM3 ones); its learning rate is the initial η,
      `state.client_work['learning_rate']`, which replaces the optimiser
      state's own at every local step (so schedules can change it).
    server_optimizer_fn: default `build_sgdm(1.0)`.
    local_steps: K ≥ 1 (required).
    ops_per_param: optimiser ops per parameter per step with fixed state;
      None: from the optimiser's kind (`adapters`).
    Others: as `fedgbo.build_fedgbo`.
  """
  if not local_steps or local_steps < 1:
    raise ValueError('mimexlite: local_steps must be an integer ≥ 1 (MimeXlite runs exactly K '
                     f'local steps per client); got {local_steps!r}')
  info = adapters.describe(client_optimizer_fn, algorithm='mimexlite')
  learning_rate = adapters.learning_rate(client_optimizer_fn, algorithm='mimexlite')
  server_optimizer_fn = server_optimizer_fn or tff.learning.optimizers.build_sgdm(1.0)
  adapters.describe(server_optimizer_fn, algorithm='mimexlite', role='server_optimizer_fn')
  if ops_per_param is None:
    ops_per_param = info.ops_per_param(moving=False)
  if options.get('upload_compression') is not None:
    raise ValueError('mimexlite: upload_compression is not supported')
  return composer.build_process(
      model_fn, mimexlite_recipe(client_optimizer_fn, server_optimizer_fn, ops_per_param),
      client_learning_rate=learning_rate, local_steps=local_steps, **options)
