"""FedProx: TFF's implementation, with the package's cost measurements.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020.

  server → clients: x_t.
  client:           local SGD on f_i(y) + (μ/2)‖y − x_t‖²; Δ_i = x_t − y_K.
  clients → server: Δ_i.
  server:           x_{t+1} = ServerOpt(x_t, Δ̄).
  network per client: down |x|, up |x|.  FLOPs: K(B·fb + 5|x|) (SPEC §8).

Wraps `tff.learning.algorithms.build_weighted_fed_prox` unchanged.
"""

from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from tff_adaptive.accounting import costs
from tff_adaptive.algorithms import composer


def build_fedprox(model_fn: Callable[[], tff.learning.models.VariableModel], *,
                  proximal_strength: float, client_learning_rate: float,
                  server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
                  client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
                  model_aggregator=None,
                  fb_flops_per_example: float = 0.0) -> tff.learning.templates.LearningProcess:
  if proximal_strength < 0:
    raise ValueError(f'--fedprox_mu must be ≥ 0; got {proximal_strength}')
  process = tff.learning.algorithms.build_weighted_fed_prox(
      model_fn, proximal_strength, tff.learning.optimizers.build_sgdm(client_learning_rate),
      server_optimizer or tff.learning.optimizers.build_sgdm(1.0),
      client_weighting=client_weighting, model_aggregator=model_aggregator,
      loop_implementation=composer.TFF_CLIENT_LOOP)
  n = costs.num_trainable_params(process)
  return costs.with_cost_metrics(
      process, download_floats=costs.model_weights_bits(process) / 32,
      upload_floats=costs.measure_upload(process).bits / 32,  # Δ, from the types
      client_state_floats=0,
      optimizer_flops_per_step=5 * n, fb_flops_per_example=fb_flops_per_example)
