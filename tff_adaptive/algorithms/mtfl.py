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

The process is `personalized.build_personalized_process`: private values are
per-client data and per-client output of the TFF computation; the loop keeps
them in a `client_state.ClientStateStore` between rounds.
"""

from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.optimizers import adapters
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.algorithms import fedopt
from tff_adaptive.personalization import process as personalized
from tff_adaptive.personalization import recipe as personal_recipe
from tff_adaptive.rounds import validation

PRIVATE_CHOICES = ('all', 'mu_sigma', 'gamma_beta', 'none')
STRATEGIES = ('fedavg', 'fedadam', 'fedavg_adam')


def patch_layout(keras_model: tf.keras.Model, private: str) -> personal_recipe.PatchLayout:
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
    return personal_recipe.PatchLayout()
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
  return personal_recipe.PatchLayout(tuple(sorted(private_t)), tuple(sorted(private_n)),
                                  tuple(description))


def adam_recipe(optimizer: biased_optimizers.BiasedOptimizer) -> personal_recipe.LocalRecipe:
  """MFL-Adam clients (FedAvg-Adam): moments move locally and are averaged."""

  def train_step(ctx, opt, batch, lr, step):
    del step
    grads, _ = ctx.grad(batch)
    opt, direction = optimizer.moving_step(opt, grads)
    ctx.assign([w - lr * d for w, d in zip(ctx.values(), direction)])
    return opt

  return personal_recipe.LocalRecipe(
      name=f'mfl_{optimizer.name}', train_step=train_step, init_optimizer=optimizer.init,
      optimizer_ops_per_param=optimizer.ops_moving, share_optimizer_state=True)


def build_mtfl(model_fn: Callable[[], tff.learning.models.VariableModel],
               keras_model_fn: Callable[[], tf.keras.Model],
               client_optimizer_fn: tff.learning.optimizers.Optimizer,
               server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None, *,
               private: str = 'all', strategy: str = 'fedavg', local_steps: int = 0,
               bias_correction: bool = False,
               client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
               fb_flops_per_example: Optional[float] = None) -> personalized.PersonalizedProcess:
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
  """
  if strategy not in STRATEGIES:
    raise errors.ArgumentError('mtfl', 'strategy',
                               f'must be one of {", ".join(STRATEGIES)}; got {strategy!r}')
  model_fn = validation.returning_a_model(model_fn, 'mtfl')
  layout = patch_layout(keras_model_fn(), private)
  with tf.Graph().as_default():
    weights = tff.learning.models.ModelWeights.from_model(model_fn())
    tff_shapes = [v.shape.as_list() for v in weights.trainable + weights.non_trainable]
  keras_model = keras_model_fn()
  keras_shapes = [v.shape.as_list() for v in
                  keras_model.trainable_variables + keras_model.non_trainable_variables]
  if tff_shapes != keras_shapes:
    raise ValueError('model_fn and keras_model_fn build different models; MTFL finds the '
                     'batch-norm patches in the Keras model')
  if server_optimizer_fn is None:
    server_optimizer_fn = (fedopt.build_server_optimizer('adam', 0.01) if strategy == 'fedadam'
                           else fedopt.build_server_optimizer('sgd', 1.0))
  if strategy == 'fedavg_adam':
    optimizer, client_learning_rate = adapters.to_biased(
        client_optimizer_fn, algorithm='mtfl', bias_correction=bias_correction)
    if optimizer.name != 'adam':
      raise errors.ArgumentError(
          'mtfl', 'strategy', f'runs Adam clients; got {optimizer.name} (pass '
          'tff.learning.optimizers.build_adam as client_optimizer_fn)', value='fedavg_adam')
    local = adam_recipe(optimizer)
  else:
    try:
      client_learning_rate = adapters.sgd_learning_rate(client_optimizer_fn, algorithm='mtfl')
    except ValueError as e:
      raise errors.ArgumentError(
          'mtfl', 'strategy', 'trains clients with SGD; an adaptive client optimiser is only '
          'used by ', errors.Given('fedavg_adam'), f' ({e})', value=strategy) from None
    local = personal_recipe.sgd_recipe()
  return personalized.build_personalized_process(
      model_fn, name=f'mtfl_{strategy}', layout=layout, local=local,
      server_optimizer=server_optimizer_fn, client_learning_rate=client_learning_rate,
      local_steps=local_steps, client_weighting=client_weighting,
      fb_flops_per_example=fb_flops_per_example,
      fingerprint={'private': private, 'strategy': strategy})
