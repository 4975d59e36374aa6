"""MTFL: Multi-Task Federated Learning with private batch-norm patches.

Mills, Hu and Min, thesis ch. 4, Algorithm 5; docs/algorithms.md#mtfl.

  server → clients: the shared (non-private) weights Ω and shared optimiser
                    values V (FedAvg-Adam only).
  client k:         M_k ← Ω patched with its private values P_k (and V's
                    private entries W_k); UA_k = accuracy of M_k on its own
                    test data (before training); K steps of LocalUpdate
                    (SGD, or Adam for FedAvg-Adam); P_k, W_k ← the new values
                    (kept by the client, never sent).
  clients → server: Δ of the shared weights (and the shared Adam m, v, step).
  server:           Ω ← GlobalModelUpdate, V ← GlobalOptimUpdate (Table 4.1):
                      FedAvg       SGD clients, average
                      FedAdam      SGD clients, server Adam on Δ̄
                      FedAvg-Adam  Adam clients (MFL-Adam), average of Ω and V

Patches are every `BatchNormalization` layer's values, private as chosen:
`all` (μ, σ, γ, β), `mu_sigma` (the moving statistics), `gamma_beta` (the
trained scale and offset), `none` (plain FL: FedAvg, FedAdam or FedAvg-Adam).
With FedAvg-Adam the Adam moments of private γ, β are private too (the
thesis: "clients store private optimiser values in their patch layers"); the
step counter is shared. Shared moving statistics are averaged (as FL averages
every model value); the server optimiser acts on trainable weights only.

A `composer.Recipe` of the package's round engine: the patches are the
recipe's private weights (`extensions.private_weights.split`),
kept by each client in its state like SCAFFOLD's c_i (with FedAvg-Adam also
the private moments, the recipe's own client state), patched over the global
model before UA and training, and left out of Δ, of the aggregate and of the
server step; shared moving statistics are averaged
(its `average_non_trainable`); UA is `extensions.user_accuracy`. The process is
the engine's `rounds.stateful.PersonalizedClientsProcess`: per client,
`process.client_input(train, stored state, test=test)`; `output.clients[i]` is
OrderedDict(ua=..., private=the new state under the store's names). With
`execution='cohort'` it runs as one program (batch norm included, with its
batch statistics over each padded batch); Keras' fused batch norm (image
inputs) falls back per client with a warning (bin/train's execution line
gives that reason).

Its rounds are bit for bit those of the personalised engine it ran on before
(deleted); the state's server statistics are OrderedDict(server=the server
optimiser's state over the shared trainable weights, client_optimizer=the
shared Adam values) as there. Changed by the port (docs/mtfl.md):
`get_hparams(state)` names the server's hyperparameters `finalizer`, as every
process of the engine does (it was `server`); the client-state store's
fingerprint and names' order, so a client-state directory written before is
refused; `cost/client_private_state_floats` is left out with private='none'.
"""

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedopt
from tff_adaptive.extensions import client_state
from tff_adaptive.extensions import private_weights
from tff_adaptive.extensions import user_accuracy
from tff_adaptive.optimizers import adapters
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.rounds import layout as round_layout
from tff_adaptive.rounds import validation

PRIVATE_CHOICES = ('all', 'mu_sigma', 'gamma_beta', 'none')
STRATEGIES = ('fedavg', 'fedadam', 'fedavg_adam')


@dataclasses.dataclass(frozen=True)
class PatchLayout:
  """Which weights of `ModelWeights` are private, by position.

  Attributes:
    private_trainable: indices into `ModelWeights.trainable` (γ, β).
    private_non_trainable: indices into `ModelWeights.non_trainable` (μ, σ²).
    description: names for messages and the client-state fingerprint.
  """
  private_trainable: tuple[int, ...] = ()
  private_non_trainable: tuple[int, ...] = ()
  description: tuple[str, ...] = ()

  @property
  def empty(self) -> bool:
    return not self.private_trainable and not self.private_non_trainable


def patch_layout(keras_model: tf.keras.Model, private: str) -> PatchLayout:
  """The positions of the private batch-norm values in `ModelWeights`.

  TFF's Keras models list weights in the Keras model's own order
  (`trainable_variables`, `non_trainable_variables`), so positions found in
  the Keras model are positions in `ModelWeights`.

  Raises:
    ValueError: an unknown choice, or a private choice for a model without
      BatchNormalization layers.
  """
  if private not in PRIVATE_CHOICES:
    raise errors.ArgumentError('patch_layout', 'private',
                               f'must be one of {", ".join(PRIVATE_CHOICES)}; got {private!r}')
  bn_layers = [m for m in keras_model.submodules
               if isinstance(m, tf.keras.layers.BatchNormalization)]
  if private == 'none':
    return PatchLayout()
  if not bn_layers:
    raise errors.ArgumentError(
        'patch_layout', 'private', "needs a model with BatchNormalization layers (MTFL's "
        f'patches), and this model ({keras_model.name}) has none; use a model with batch norm or ',
        errors.Given('none'), ' (plain FL)', value=private)
  trainable = list(keras_model.trainable_variables)
  non_trainable = list(keras_model.non_trainable_variables)
  private_t, private_n, description = [], [], []
  wanted = {'all': ('gamma', 'beta', 'moving_mean', 'moving_variance'),
            'mu_sigma': ('moving_mean', 'moving_variance'),
            'gamma_beta': ('gamma', 'beta')}[private]
  for layer in bn_layers:
    for attr in wanted:
      variable = getattr(layer, attr, None)
      if variable is None:  # center=False / scale=False
        continue
      # A frozen layer's γ, β are non-trainable: look in both lists.
      for pool, out in ((trainable, private_t), (non_trainable, private_n)):
        index = next((i for i, v in enumerate(pool) if v is variable), None)
        if index is not None:
          out.append(index)
          description.append(f'{layer.name}.{attr}')
          break
  return PatchLayout(tuple(sorted(private_t)), tuple(sorted(private_n)),
                                  tuple(description))


def _shared(private, count):
  return [i for i in range(count) if i not in private]


def _client_adam(optimizer: biased_optimizers.BiasedOptimizer, private):
  """The client-side functions of MFL-Adam clients (FedAvg-Adam) whose moments of
  the `private` trainable positions stay with the client."""

  def full(broadcast, own, y0):
    # Shared moments and the step from the server, private ones from the client.
    opt = collections.OrderedDict()
    for key in ('m', 'v'):
      values = list(broadcast[key])
      for i, value in zip(private, own[key] if own else ()):
        values.insert(i, value)
      opt[key] = tuple(values)
    opt['step'] = broadcast['step']
    del y0
    return opt

  def local_step(opt, y, grads, lr, step):
    del step
    opt, direction = optimizer.moving_step(opt, grads)
    return opt, [w - lr * d for w, d in zip(y, direction)]

  def shared_part(opt):
    out = collections.OrderedDict(
        (key, tuple(opt[key][i] for i in _shared(private, len(opt[key])))) for key in ('m', 'v'))
    out['step'] = opt['step']
    return out

  def own_part(opt):
    return collections.OrderedDict((key, tuple(opt[key][i] for i in private)) for key in ('m', 'v'))

  return full, local_step, shared_part, own_part


def mtfl_recipe(layout: PatchLayout, strategy: str,
                server_optimizer: tff.learning.optimizers.Optimizer,
                optimizer: Optional[biased_optimizers.BiasedOptimizer] = None,
                weighting=tff.learning.ClientWeighting.NUM_EXAMPLES) -> composer.Recipe:
  """MTFL(`strategy`) with `layout`'s private weights; `optimizer`: FedAvg-Adam's
  client Adam (None: SGD clients). The server optimiser steps the shared
  trainable weights only (its state has their shapes)."""
  private = layout.private_trainable
  adam = optimizer is not None
  if adam:
    full, adam_step, shared_part, own_part = _client_adam(optimizer, private)

  def init_stats(specs):
    shared = [tf.TensorSpec(specs[i].shape, specs[i].dtype)
              for i in _shared(private, len(specs))]
    return collections.OrderedDict(
        server=server_optimizer.initialize(tuple(shared)),
        client_optimizer=(shared_part(optimizer.init(specs)) if adam
                          else collections.OrderedDict()))

  def init_local(broadcast, y0, own=()):
    return full(broadcast, own, y0) if adam else collections.OrderedDict()

  def local_step(local, y, grads, lr, step):
    if adam:
      return adam_step(local, y, grads, lr, step)
    return local, [w - lr * g for w, g in zip(y, grads)]

  def server_update(x, s, mean_delta, mean_extra, lr, local_steps):
    del lr, local_steps
    shared = _shared(private, len(x))
    server, new_shared = server_optimizer.next(
        s['server'], tuple(x[i] for i in shared), tuple(mean_delta[i] for i in shared))
    new_x = list(x)
    for i, value in zip(shared, new_shared):
      new_x[i] = value
    client_optimizer = mean_extra if adam else s['client_optimizer']
    return new_x, collections.OrderedDict(server=server, client_optimizer=client_optimizer)

  # Adam's moments of the private weights stay with the client, beside them.
  own = (client_state.ClientState(
      lambda specs: own_part(optimizer.init(specs)), own_part,
      tuple(f'optimizer_{key}_{i}' for key in ('m', 'v') for i in private))
         if adam and private else None)
  return composer.Recipe(
      name=f'mtfl_{strategy}', init_stats=init_stats, broadcast=lambda s: s['client_optimizer'],
      init_local=init_local, local_step=local_step, server_update=server_update,
      upload=(lambda local, g0: shared_part(local)) if adam else None,
      weighting=weighting, **({'optimizer_ops_per_param': optimizer.ops_moving} if adam else {}),
      get_server_hparams=lambda s: server_optimizer.get_hparams(s['server']),
      set_server_hparams=lambda s, h: collections.OrderedDict(
          server=server_optimizer.set_hparams(s['server'], h),
          client_optimizer=s['client_optimizer']),
      extensions=(user_accuracy.UserAccuracy(),) + private_weights.split(
          private, layout.private_non_trainable, average_non_trainable=True, own=own))


def _client_optimizer(client_optimizer_fn, strategy: str, bias_correction: bool):
  """(FedAvg-Adam's biased Adam or None, the client learning rate)."""
  if strategy == 'fedavg_adam':
    optimizer, client_learning_rate = adapters.to_biased(
        client_optimizer_fn, algorithm='mtfl', bias_correction=bias_correction)
    if optimizer.name != 'adam':
      raise errors.ArgumentError(
          'mtfl', 'strategy', f'runs Adam clients; got {optimizer.name} (pass '
          'tff.learning.optimizers.build_adam as client_optimizer_fn)', value='fedavg_adam')
    return optimizer, client_learning_rate
  try:
    return None, adapters.sgd_learning_rate(client_optimizer_fn, algorithm='mtfl')
  except ValueError as e:
    raise errors.ArgumentError(
        'mtfl', 'strategy', 'trains clients with SGD; an adaptive client optimiser is only '
        'used by ', errors.Given('fedavg_adam'), f' ({e})', value=strategy) from None


def _check_same_models(model_fn, keras_model_fn) -> None:
  with tf.Graph().as_default():
    weights = tff.learning.models.ModelWeights.from_model(model_fn())
    tff_shapes = [v.shape.as_list() for v in weights.trainable + weights.non_trainable]
  keras_model = keras_model_fn()
  keras_shapes = [v.shape.as_list() for v in
                  keras_model.trainable_variables + keras_model.non_trainable_variables]
  if tff_shapes != keras_shapes:
    raise ValueError('model_fn and keras_model_fn build different models; MTFL finds the '
                     'batch-norm patches in the Keras model')


def upload_type(process, layout: PatchLayout) -> tff.Type:
  """What one client uploads: OrderedDict(trainable=Δ shared, non_trainable=Δ shared
  moving statistics[, optimizer=shared Adam m, v, step]), as TFF types."""
  state = process.initialize()
  weights = process.get_model_weights(state)
  spec = lambda t: tff.types.tensorflow_to_type(tf.TensorSpec(t.shape, t.dtype))
  t, n = list(weights.trainable), list(weights.non_trainable)
  fields = [('trainable', tff.StructWithPythonType(
                [spec(t[i]) for i in _shared(layout.private_trainable, len(t))], tuple)),
            ('non_trainable', tff.StructWithPythonType(
                [spec(n[i]) for i in _shared(layout.private_non_trainable, len(n))], tuple))]
  optimizer = state.finalizer['client_optimizer']
  if optimizer:  # FedAvg-Adam: the shared m, v (tuples) and the step
    fields.append(('optimizer', tff.StructWithPythonType(
        [(k, tff.StructWithPythonType([spec(a) for a in v], tuple) if isinstance(v, tuple)
          else spec(v)) for k, v in optimizer.items()], collections.OrderedDict)))
  return tff.StructWithPythonType(fields, collections.OrderedDict)


def build_mtfl(model_fn: Callable[[], tff.learning.models.VariableModel],
               keras_model_fn: Callable[[], tf.keras.Model],
               client_optimizer_fn: tff.learning.optimizers.Optimizer,
               server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None, *,
               private: str = 'all', strategy: str = 'fedavg', local_steps: int = 0,
               bias_correction: bool = False,
               client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
               fb_flops_per_example: Optional[float] = None, execution: Any = 'per_client'):
  """MTFL(strategy) with `private` batch-norm values.

  Args:
    model_fn: the TFF model (built from `keras_model_fn`'s model).
    keras_model_fn: the Keras model, to find the batch-norm layers (MTFL
      needs both, so it takes no FunctionalModel).
    client_optimizer_fn: `tff.learning.optimizers.build_sgdm(η)` for the
      fedavg and fedadam strategies; an Adam (`build_adam(η, beta_1, beta_2,
      epsilon)`, read as MFL's Adam: m = 0, v = 1, `bias_correction`) for
      fedavg_adam.
    server_optimizer_fn: defaults: SGD with rate 1 (an average) for fedavg and
      fedavg_adam, TFF's Adam (rate 0.01) for fedadam.
    private: all | mu_sigma | gamma_beta | none.
    strategy: fedavg | fedadam | fedavg_adam (thesis Table 4.1).
    local_steps: K (0: one pass over the client data per round).
    client_weighting: weights of the average.
    fb_flops_per_example: forward+backward FLOPs per example; None: counted
      from the model.
    execution: 'per_client', 'cohort' or a `cohort.CohortExecution`
      (`composer.RoundOptions.execution`).

  Returns the engine's `rounds.stateful.PersonalizedClientsProcess` (or its
  cohort form), with `upload_type` and `upload_bits` (what one client uploads).
  """
  if strategy not in STRATEGIES:
    raise errors.ArgumentError('mtfl', 'strategy',
                               f'must be one of {", ".join(STRATEGIES)}; got {strategy!r}')
  model_fn = validation.returning_a_model(model_fn, 'mtfl')
  layout = patch_layout(keras_model_fn(), private)
  _check_same_models(model_fn, keras_model_fn)
  if server_optimizer_fn is None:
    server_optimizer_fn = (fedopt.build_server_optimizer('adam', 0.01) if strategy == 'fedadam'
                           else fedopt.build_server_optimizer('sgd', 1.0))
  optimizer, client_learning_rate = _client_optimizer(client_optimizer_fn, strategy,
                                                      bias_correction)
  validation.check_client_weighting(client_weighting, 'mtfl')
  recipe = mtfl_recipe(layout, strategy, server_optimizer_fn, optimizer,
                       client_weighting or tff.learning.ClientWeighting.NUM_EXAMPLES)
  process = composer.build_process(
      model_fn, recipe, client_learning_rate=client_learning_rate, local_steps=local_steps,
      client_weighting=client_weighting, fb_flops_per_example=fb_flops_per_example,
      execution=execution)
  process.upload_type = upload_type(process, layout)
  process.upload_bits = round_layout.num_bits(process.upload_type)
  process.fingerprint.update(patches=list(layout.description), choice=private, strategy=strategy)
  return process
