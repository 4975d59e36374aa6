"""Mimelite: TFF's implementation, with the package's cost measurements.

Karimireddy et al., "Breaking the centralized barrier for cross-device
federated learning" (Mime), NeurIPS 2021; a baseline of seed 000 (SPEC §3).

  server → clients: x_t and the base optimiser state s_t.
  client:           full gradient ∇f_i(x_t) over the client's dataset; local
                    steps with BaseOpt using s_t FIXED; Δ_i = x_t − y_K.
  clients → server: Δ_i and ∇f_i(x_t) (2|x|).
  server:           x_{t+1} = ServerOpt(x_t, Δ̄); s_{t+1} = BaseOpt state after a
                    step with the mean full gradient.
  network per client: down |x| + |s|, up 2|x|.

This wraps `tff.learning.algorithms.build_weighted_mime_lite` /
`build_unweighted_mime_lite` unchanged. TFF computes the "full" gradient over
the dataset the client is given: with `--local_steps=K` that is the round's K
minibatches; with epochs it is all local data (n_i examples).
"""

from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.accounting import costs
from tff_adaptive.algorithms import composer


def build_mimelite(model_fn: Callable[[], tff.learning.models.VariableModel], *,
                   base_optimizer: tff.learning.optimizers.Optimizer,
                   server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
                   client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
                   model_aggregator=None, ops_per_param: float = 5.0,
                   fb_flops_per_example: float = 0.0) -> tff.learning.templates.LearningProcess:
  server_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(1.0)
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    process = tff.learning.algorithms.build_unweighted_mime_lite(
        model_fn, base_optimizer, server_optimizer, model_aggregator=model_aggregator,
        loop_implementation=composer.TFF_CLIENT_LOOP)
  else:
    process = tff.learning.algorithms.build_weighted_mime_lite(
        model_fn, base_optimizer, server_optimizer, client_weighting=client_weighting,
        model_aggregator=model_aggregator, loop_implementation=composer.TFF_CLIENT_LOOP)
  n = costs.num_trainable_params(process)
  state_floats = _state_floats(base_optimizer, model_fn)
  # TFF's Mime broadcasts the model weights and the whole base-optimiser state
  # (its hyperparameter scalars and step counter included).
  download_bits = costs.model_weights_bits(process) + _state_bits(base_optimizer, model_fn)
  return costs.with_cost_metrics(
      process, download_floats=download_bits / 32,
      upload_floats=costs.measure_upload(process).bits / 32,  # Δ and ∇f, from the types
      client_state_floats=state_floats, optimizer_flops_per_step=ops_per_param * n,
      fb_flops_per_example=fb_flops_per_example, extra_passes=1.0)


def _state_bits(optimizer, model_fn) -> int:
  with tf.Graph().as_default():
    specs = [tf.TensorSpec(v.shape, v.dtype) for v in model_fn().trainable_variables]
    state = [tf.convert_to_tensor(t) for t in tf.nest.flatten(optimizer.initialize(specs))]
  return sum(int(t.shape.num_elements()) * t.dtype.size * 8 for t in state)


def _state_floats(optimizer, model_fn) -> int:
  with tf.Graph().as_default():
    specs = [tf.TensorSpec(v.shape, v.dtype) for v in model_fn().trainable_variables]
    state = optimizer.initialize(specs)
  # Scalars (learning rate, momentum, step) are hyperparameters, not memory.
  return sum(int(tf.convert_to_tensor(t).shape.num_elements()) for t in tf.nest.flatten(state)
             if tf.convert_to_tensor(t).shape.rank)
