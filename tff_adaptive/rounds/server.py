"""The server side of a round: the recipe's server step, the costs and the metrics.

Both executions hand the same summed client structure (`client.client_sums`)
to `ServerRound`, so x_{t+1}, s_{t+1}, the costs and the metrics are computed by
one function.
"""

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.accounting import drift
from tff_adaptive.rounds import layout
from tff_adaptive.rounds import recipe as recipe_lib


@dataclasses.dataclass(frozen=True)
class RoundCosts:
  """What a round costs per client (docs/algorithms.md#costs), measured from the TFF types sent.

  The whole ModelWeights is broadcast (non-trainable weights, e.g. BatchNorm
  statistics, included); only trainable deltas (and the extra upload) come back.
  """
  down_bits: int
  up_payload_bits: int
  client_state_floats: int
  optimizer_flops_per_step: float
  fb_flops_per_example: Optional[float]
  # Forward/backward passes per trained example (`Recipe.fb_passes`: 1 and the
  # extensions' extra passes).
  fb_passes: float = 1.0
  # Floats each client keeps between rounds, when its state keeper reports them
  # (private weights: MTFL's patches).
  private_state_floats: Optional[int] = None

  @classmethod
  def from_types(cls, recipe: recipe_lib.Recipe, *, weights_type, broadcast_type, delta_type,
                 extra_type, trainable_specs, fb_flops_per_example, non_trainable_specs=()):
    split, keeper = recipe.weights_split, recipe.state_keeper
    undownloaded = (split.undownloaded_specs(list(trainable_specs), list(non_trainable_specs))
                    if split is not None else [])
    private_bits = sum(layout.num_bits(tff.types.tensorflow_to_type(s)) for s in undownloaded)
    down = (layout.num_bits(weights_type) + layout.num_bits(broadcast_type) +
            layout.num_bits(layout.hparams_type(recipe.client_hparams)) - private_bits)
    up = layout.num_bits(delta_type) + (
        layout.num_bits(extra_type) if recipe.upload is not None else 0)
    zeros = lambda type_spec: layout.zeros_like_specs(tff.types.type_to_tf_tensor_specs(type_spec))

    def local_state():
      own = keeper.own_state_specs(list(trainable_specs)) if keeper is not None else None
      return recipe.init_local(zeros(broadcast_type),
                               layout.zeros_like_specs(list(trainable_specs)),
                               *(() if own is None else (own,)))

    local_state_type = tff.tensorflow.computation(local_state).type_signature.result
    # Tensors only: scalar leaves are hyperparameters (η, β) or counters.
    state_floats = sum(int(np.prod(t.shape)) for t in layout.leaves(local_state_type)
                       if t.dtype in (np.float32, np.float64) and len(t.shape) >= 1)
    num_params = sum(int(np.prod(s.shape)) for s in trainable_specs)
    private_floats = (keeper.private_state_floats(list(trainable_specs), list(non_trainable_specs))
                      if keeper is not None else None)
    return cls(down, up, state_floats, recipe.optimizer_ops_per_param * num_params,
               fb_flops_per_example, recipe.fb_passes, private_floats)

  def metrics(self, sums, measured_upload_bits):
    clients = tf.maximum(tf.cast(sums['clients'], tf.float64), 1.0)
    # A compressing aggregator measures the real encoded size (< 0: none).
    upload_bits = tf.where(measured_upload_bits >= 0, measured_upload_bits,
                           tf.constant(float(self.up_payload_bits), tf.float64))
    down = tf.constant(float(self.down_bits), tf.float64)
    steps = tf.cast(sums['local_steps'], tf.float64)
    cost = collections.OrderedDict(
        download_bits_per_client=down, upload_bits_per_client=upload_bits,
        download_bits=down * clients, upload_bits=upload_bits * clients, client_steps=steps)
    if self.fb_flops_per_example is not None:
      flops = (tf.cast(sums['num_examples'], tf.float64) * self.fb_flops_per_example *
               self.fb_passes +
               steps * self.optimizer_flops_per_step)
      cost['client_flops'] = flops
      cost['client_flops_per_client'] = flops / clients
    cost['client_optimizer_state_floats'] = tf.constant(float(self.client_state_floats),
                                                        tf.float64)
    if self.private_state_floats is not None:
      cost['client_private_state_floats'] = tf.constant(float(self.private_state_floats),
                                                        tf.float64)
    return cost


class ServerRound:
  """(x_t, s_t, hparams, client sums, Δ̄, mean extra) → (x_{t+1}, s_{t+1}, metrics)."""

  def __init__(self, recipe: recipe_lib.Recipe, costs: RoundCosts, finalizers,
               measure_client_drift: bool):
    self.recipe = recipe
    self.costs = costs
    # None: the train metrics are aggregated elsewhere (a metrics_aggregator).
    self.finalizers = finalizers
    self.measure_client_drift = measure_client_drift

  def __call__(self, model_weights, stats, hparams, sums, mean_delta, mean_extra,
               measured_upload_bits):
    with tf.control_dependencies(self._checks(sums)):
      x = [tf.identity(t) for t in tf.nest.flatten(model_weights.trainable)]
    recipe, split = self.recipe, self.recipe.weights_split
    delta = (split.server_delta(x, mean_delta) if split is not None
             else list(tf.nest.flatten(mean_delta)))
    new_x, new_stats = recipe.server_update(
        x, stats, delta, mean_extra, hparams['learning_rate'], hparams['local_steps'])
    non_trainable = model_weights.non_trainable
    if split is not None:
      new_x, non_trainable = split.server_weights(x, list(new_x), non_trainable, mean_delta)
    # The containers of s_0 (lists vs tuples): a checkpoint is restored into
    # the structure `initialize` returns and must match it exactly.
    new_stats = tf.nest.pack_sequence_as(stats, tf.nest.flatten(new_stats))
    new_weights = tff.learning.models.ModelWeights(
        trainable=tf.nest.pack_sequence_as(model_weights.trainable, list(new_x)),
        non_trainable=non_trainable)
    return new_weights, new_stats, self._metrics(sums, measured_upload_bits)

  def from_weighted_sums(self, model_weights, stats, hparams, sums):
    """The fused example-weighted mean: Σ w·Δ / Σ w, as `tff.aggregators.MeanFactory`.

    A recipe's summed extra upload (`Recipe.sum_extra`) is passed on as Σ extra_i.
    """
    mean = lambda t: tf.math.divide_no_nan(t, sums['weight'])
    return self(model_weights, stats, hparams, sums,
                tf.nest.map_structure(mean, sums['weighted_delta']), self.mean_extra(sums),
                tf.constant(-1.0, tf.float64))

  def mean_extra(self, sums):
    """Σ w·extra / Σ w, or Σ extra_i for a recipe whose extra upload is summed."""
    if self.recipe.sum_extra:
      return sums['weighted_extra']
    return tf.nest.map_structure(lambda t: tf.math.divide_no_nan(t, sums['weight']),
                                 sums['weighted_extra'])

  def _checks(self, sums):
    return [check for ext in self.recipe.extensions
            for check in ext.server_checks(self.recipe, sums)]

  def _metrics(self, sums, measured_upload_bits):
    clients = tf.maximum(tf.cast(sums['clients'], tf.float32), 1.0)
    metrics = collections.OrderedDict(
        first_minibatch_loss=sums['first_minibatch_loss'] / clients,
        cost=self.costs.metrics(sums, measured_upload_bits))
    if self.finalizers is not None:
      metrics['train'] = collections.OrderedDict(
          (name, finalizer(sums['metrics'][name])) for name, finalizer in self.finalizers.items())
    if self.measure_client_drift:
      metrics['client_drift'] = collections.OrderedDict(
          delta_cosine_distance=drift.mean_cosine_distance_from_sum(
              sums['drift_delta_sum'], sums['drift_delta_n']),
          model_cosine_distance=drift.mean_cosine_distance_from_sum(
              sums['drift_model_sum'], sums['drift_model_n']),
          num_clients=sums['drift_delta_n'])
    return metrics
