"""FedProx: TFF's implementation, with the package's cost measurements.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020.

  server → clients: x_t.
  client:           local SGD on f_i(y) + (μ/2)‖y − x_t‖²; Δ_i = x_t − y_K.
  clients → server: Δ_i.
  server:           x_{t+1} = ServerOpt(x_t, Δ̄).
  network per client: down |x|, up |x|.  FLOPs: K(B·fb + 5|x|) (docs/algorithms.md#costs).

Wraps `tff.learning.algorithms.build_weighted_fed_prox` unchanged.
"""

from typing import Optional

import tensorflow_federated as tff

from tff_adaptive.accounting import costs
from tff_adaptive.algorithms import composer
from tff_adaptive.optimizers import adapters


def build_fedprox(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    proximal_strength: float,
    client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
    model_distributor=None,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    metrics_aggregator=None,
    loop_implementation: tff.learning.LoopImplementation = composer.TFF_CLIENT_LOOP,
    fb_flops_per_example: Optional[float] = None,
) -> tff.learning.templates.LearningProcess:
  """TFF's `build_weighted_fed_prox` with `cost/` metrics (module docstring).

  `client_optimizer_fn` (the paper: `build_sgdm(η)`) and `server_optimizer_fn`
  (default `build_sgdm(1.0)`) are TFF optimisers; `proximal_strength` is μ.
  Others go to TFF's builder; `fb_flops_per_example=None` counts FLOPs from
  the model.
  """
  if proximal_strength < 0:
    raise ValueError(f'fedprox: proximal_strength must be ≥ 0; got {proximal_strength}')
  info = adapters.describe(client_optimizer_fn, algorithm='fedprox')
  server_optimizer_fn = server_optimizer_fn or tff.learning.optimizers.build_sgdm(1.0)
  adapters.describe(server_optimizer_fn, algorithm='fedprox', role='server_optimizer_fn')
  process = tff.learning.algorithms.build_weighted_fed_prox(
      model_fn, proximal_strength, client_optimizer_fn, server_optimizer_fn,
      client_weighting=client_weighting, model_distributor=model_distributor,
      model_aggregator=model_aggregator, metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation)
  n = costs.num_trainable_params(process)
  if fb_flops_per_example is None:
    fb_flops_per_example = costs.count_fb_flops(model_fn, 'fedprox')
  # The proximal term adds 3 ops per parameter (w − x_t, ·μ, +) to the client
  # optimiser's step.
  return costs.with_cost_metrics(
      process, download_floats=costs.model_weights_bits(process) / 32,
      upload_floats=costs.measure_upload(process).bits / 32,  # Δ, from the types
      client_state_floats=0,
      optimizer_flops_per_step=(info.ops_per_param(moving=True) + 3) * n,
      fb_flops_per_example=fb_flops_per_example)
