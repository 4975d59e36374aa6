"""CE-FedAvg: Communication-Efficient FedAvg — distributed Adam, compressed uploads.

Mills, Hu, Min, "Communication-Efficient Federated Learning for Wireless Edge
Intelligence in IoT", IEEE IoT Journal 2020 (thesis ch. 3); docs/algorithms.md#ce-fedavg.

  server → clients: x_t and Adam's (m_t, v_t, t) — uncompressed.
  client:           K ordinary Adam steps from (x_t, m_t, v_t) (MFL-Adam);
                    Δω = x_t − y_K, Δm = m_K − m_t, Δv = v_K − v_t.
  clients → server: each rank ≥ 2 tensor of Δω top-(1−s) sparsified, with Δm
                    and Δv taken at Δω's indices (Golomb-coded gaps); values
                    UniQ (Δω) / ExpQ (Δm, Δv) 8-bit; rank-1 tensors dense and
                    quantised; no error feedback. The step counter is sent as
                    one float.
  server:           weighted means of the decoded Δω, Δm, Δv:
                    x_{t+1} = x_t − mean Δω, m_{t+1} = m_t + mean Δm, ...
  bits up per client: measured from the real encoded message (≈ thesis eq.
                    3.2: 224|W| + (1−s)(24 + g_s)Σ|ω|).
"""

from typing import Any

import tensorflow_federated as tff

from tff_adaptive.aggregators import compression
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import mfl
from tff_adaptive.optimizers import adapters


def build_ce_fedavg(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    sparsity: float,
    quantize: bool = True,
    local_steps: int = 0,
    bias_correction: bool = True,
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """CE-FedAvg: MFL-Adam whose uploads are compressed (module docstring).

  `client_optimizer_fn`: an Adam (`tff.learning.optimizers.build_adam(η,
  beta_1, beta_2, epsilon)` or the paper-semantics Adam); its hyperparameters
  are read. Adam is bias-corrected by default (the thesis uses standard Adam).
  The aggregation is the compression itself: no `model_aggregator` or
  `model_distributor`.
  """
  for refused in ('model_aggregator', 'upload_compression', 'model_distributor'):
    if options.get(refused) is not None:
      raise ValueError(f'ce_fedavg: {refused} is not supported: the aggregation is the '
                       'compression itself')
  kind = adapters.describe(client_optimizer_fn, algorithm='ce_fedavg').kind
  if kind not in ('adam', 'paper_adam'):
    raise ValueError(f'ce_fedavg runs Adam clients: client_optimizer_fn must be an Adam '
                     '(tff.learning.optimizers.build_adam or '
                     f'tff_adaptive.optimizers.build_paper_client_adam); got {kind}')
  return mfl.build_mfl(
      model_fn, client_optimizer_fn, local_steps=local_steps, bias_correction=bias_correction,
      upload_compression=compression.SharedIndexCompressionFactory(sparsity, quantize),
      upload_state_deltas=True, **options)
