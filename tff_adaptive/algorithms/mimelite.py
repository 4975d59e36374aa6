"""Mimelite: TFF's implementation, with the package's cost measurements.

Karimireddy et al., "Breaking the centralized barrier for cross-device
federated learning" (Mime), NeurIPS 2021; a baseline of the FedGBO paper (docs/algorithms.md#mimelite-and-mimexlite).

  server → clients: x_t and the base optimiser state s_t.
  client:           full gradient ∇f_i(x_t) over the client's dataset; local
                    steps with BaseOpt using s_t FIXED; Δ_i = x_t − y_K.
  clients → server: Δ_i and ∇f_i(x_t) (2|x|).
  server:           x_{t+1} = ServerOpt(x_t, Δ̄); s_{t+1} = BaseOpt state after a
                    step with the mean full gradient.
  network per client: down |x| + |s|, up 2|x|.

This wraps `tff.learning.algorithms.build_weighted_mime_lite` /
`build_unweighted_mime_lite` unchanged. TFF computes the "full" gradient over
the dataset the client is given: when the training loop cuts it to K local
steps that is the round's K minibatches; with epochs it is all local data
(n_i examples).
"""

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.accounting import costs
from tff_adaptive.algorithms import composer
from tff_adaptive.optimizers import adapters


def build_mimelite(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
    model_distributor=None,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    full_gradient_aggregator=None,
    metrics_aggregator=None,
    loop_implementation: tff.learning.LoopImplementation = composer.TFF_CLIENT_LOOP,
    ops_per_param: Optional[float] = None,
    fb_flops_per_example: Optional[float] = None,
) -> tff.learning.templates.LearningProcess:
  """TFF's Mimelite with `cost/` metrics (see module docstring).

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel` (TFF's Mime takes both).
    client_optimizer_fn: Mime's base optimiser (TFF's `base_optimizer`): any
      `tff.learning.optimizers.Optimizer`; its learning rate is η, scheduled
      through `state.client_work[0]['learning_rate']`.
    server_optimizer_fn: TFF's `server_optimizer`; default `build_sgdm(1.0)`.
    client_weighting, model_distributor, model_aggregator,
    full_gradient_aggregator, metrics_aggregator: passed to TFF's builder (an
      unweighted `model_aggregator` selects `build_unweighted_mime_lite`,
      which takes no client_weighting).
    loop_implementation: default DATASET_ITERATOR (TFF's default is
      DATASET_REDUCE; same result, cheaper in the C++ executor).
    ops_per_param: base-optimiser ops per parameter per step (fixed state);
      None: from its kind (`adapters`).
    fb_flops_per_example: None: counted from the model (`composer.count_fb_flops`).
  """
  info = adapters.describe(client_optimizer_fn, algorithm='mimelite')
  server_optimizer_fn = server_optimizer_fn or tff.learning.optimizers.build_sgdm(1.0)
  adapters.describe(server_optimizer_fn, algorithm='mimelite', role='server_optimizer_fn')
  if ops_per_param is None:
    ops_per_param = info.ops_per_param(moving=False)
  common = dict(model_distributor=model_distributor, model_aggregator=model_aggregator,
                full_gradient_aggregator=full_gradient_aggregator,
                metrics_aggregator=metrics_aggregator, loop_implementation=loop_implementation)
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    if client_weighting != tff.learning.ClientWeighting.NUM_EXAMPLES and client_weighting not in (
        None, tff.learning.ClientWeighting.UNIFORM):
      raise ValueError('mimelite: an unweighted model_aggregator averages uniformly; '
                       f'client_weighting={client_weighting} cannot apply')
    process = tff.learning.algorithms.build_unweighted_mime_lite(
        model_fn, client_optimizer_fn, server_optimizer_fn, **common)
  else:
    process = tff.learning.algorithms.build_weighted_mime_lite(
        model_fn, client_optimizer_fn, server_optimizer_fn, client_weighting=client_weighting,
        **common)
  n = costs.num_trainable_params(process)
  trainable_specs = costs.trainable_specs(process)
  state_floats = _state_floats(client_optimizer_fn, trainable_specs)
  # TFF's Mime broadcasts the model weights and the whole base-optimiser state
  # (its hyperparameter scalars and step counter included).
  download_bits = costs.model_weights_bits(process) + _state_bits(client_optimizer_fn,
                                                                   trainable_specs)
  if fb_flops_per_example is None:
    fb_flops_per_example = costs.count_fb_flops(model_fn, 'mimelite')
  return costs.with_cost_metrics(
      process, download_floats=download_bits / 32,
      upload_floats=costs.measure_upload(process).bits / 32,  # Δ and ∇f, from the types
      client_state_floats=state_floats, optimizer_flops_per_step=ops_per_param * n,
      fb_flops_per_example=fb_flops_per_example, extra_passes=1.0)


def _state_bits(optimizer, specs) -> int:
  with tf.Graph().as_default():
    state = [tf.convert_to_tensor(t) for t in tf.nest.flatten(optimizer.initialize(specs))]
  return sum(int(t.shape.num_elements()) * t.dtype.size * 8 for t in state)


def _state_floats(optimizer, specs) -> int:
  with tf.Graph().as_default():
    state = optimizer.initialize(specs)
  # Scalars (learning rate, momentum, step) are hyperparameters, not memory.
  return sum(int(tf.convert_to_tensor(t).shape.num_elements()) for t in tf.nest.flatten(state)
             if tf.convert_to_tensor(t).shape.rank)
