"""`ModelInfo`: what a round needs to know about the model and the recipe's types."""

import collections
from collections.abc import Callable
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.accounting import costs as costs_lib
from tff_adaptive.rounds import layout
from tff_adaptive.rounds import recipe as recipe_lib
from tff_adaptive.rounds import server as server_lib


class ModelInfo:
  """Types and computations derived once from `model_fn` and the recipe.

  Attributes:
    model_fn: no-arg callable returning the `VariableModel`.
    finalizers: the model's metric finalizers (applied to summed metrics).
    fb_flops_per_example: counted from the Keras model, or None.
    element_type, weights_type, trainable_specs: the model's TFF types.
    init_stats, stats_type, broadcast_type: the recipe's s_0 and its types.
    message_type, server_message_fn: what the server broadcasts.
  """

  def __init__(self, model_fn: Callable[[], tff.learning.models.VariableModel],
               recipe: recipe_lib.Recipe, fb_flops_per_example: Optional[float]):
    self.model_fn = model_fn
    with tf.Graph().as_default():
      model = model_fn()
      if not isinstance(model, tff.learning.models.VariableModel):
        raise TypeError(f'{recipe.name}: model_fn must return a '
                        'tff.learning.models.VariableModel; it returned '
                        f'{type(model).__name__}')
      # Applied to the clients' summed metrics, as sum_then_finalize does.
      self.finalizers = model.metric_finalizers()
      self.fb_flops_per_example = (costs_lib.count_fb_flops(model, recipe.name)
                                   if fb_flops_per_example is None else fb_flops_per_example)
    self.element_type = tff.types.tensorflow_to_type(model.input_spec)
    self.weights_type = tff.learning.models.weights_type_from_model(model)
    self.trainable_specs = list(tf.nest.flatten(
        tff.types.type_to_tf_tensor_specs(self.weights_type.trainable)))
    self.non_trainable_specs = list(tf.nest.flatten(
        tff.types.type_to_tf_tensor_specs(self.weights_type.non_trainable)))
    self._recipe = recipe
    # A state of private weights starts where the server's model starts (the
    # model's seeded initialisers build the same one): its values, read once, eagerly.
    keeper = recipe.state_keeper
    self._initial_weights = (
        tf.nest.map_structure(lambda v: np.asarray(v.numpy()),
                              tff.learning.models.ModelWeights.from_model(model_fn()))
        if keeper is not None and keeper.needs_initial_weights else None)

    @tff.tensorflow.computation
    def init_stats():
      return recipe.init_stats(list(self.trainable_specs))

    self.init_stats = init_stats
    self.stats_type = init_stats.type_signature.result

    @tff.tensorflow.computation(self.stats_type)
    def broadcast_fn(stats):
      return recipe.broadcast(stats)

    self.broadcast_type = broadcast_fn.type_signature.result
    self.client_hparams = dict(recipe.client_hparams)
    self.hparams_type = layout.hparams_type(self.client_hparams)
    self.message_type = tff.StructWithPythonType(
        [('model_weights', self.weights_type), ('broadcast', self.broadcast_type),
         ('hparams', self.hparams_type)], collections.OrderedDict)

    @tff.tensorflow.computation(self.weights_type, self.stats_type, self.hparams_type)
    def server_message_fn(model_weights, stats, hparams):
      return server_message(recipe, model_weights, stats, hparams)

    self.server_message_fn = server_message_fn

  def client_model(self):
    return client_model(self.model_fn)

  def initial_client_state(self):
    """A client's state before its first round (`Recipe.initial_client_state`)."""
    return self._recipe.initial_client_state(self.trainable_specs, self._initial_weights)

  def costs(self, recipe, delta_type, extra_type, fb_flops_per_example=None):
    return server_lib.RoundCosts.from_types(
        recipe, weights_type=self.weights_type, broadcast_type=self.broadcast_type,
        delta_type=delta_type, extra_type=extra_type, trainable_specs=self.trainable_specs,
        non_trainable_specs=self.non_trainable_specs, fb_flops_per_example=(self.fb_flops_per_example if fb_flops_per_example is None
                              else fb_flops_per_example))


def server_message(recipe, model_weights, stats, hparams):
  return collections.OrderedDict(model_weights=model_weights, broadcast=recipe.broadcast(stats),
                                 hparams=hparams)


def client_model(model_fn: Callable[[], tff.learning.models.VariableModel]):
  """`model_fn()` for a client computation: trainable variables start at zero.

  A client overwrites its trainable variables with the broadcast weights
  before using them, but TFF runs every variable initialiser at each call of
  the client computation: random initialisers (Glorot etc.) cost ~8 ms per
  client per round on the EMNIST CNN (Philox in `perf`, docs/performance.md)
  for values nobody reads. Non-trainable variables (metrics, BatchNorm
  statistics, RNG states) keep their initialisers.
  """
  def zero_trainable(next_creator, **kwargs):
    shape, dtype = kwargs.get('shape'), kwargs.get('dtype')
    if (kwargs.get('trainable') is not False and shape is not None and dtype is not None
        and tf.TensorShape(shape).is_fully_defined()):
      kwargs['initial_value'] = tf.zeros(shape, tf.as_dtype(dtype).base_dtype)
    return next_creator(**kwargs)

  with tf.variable_creator_scope(zero_trainable):
    return model_fn()
