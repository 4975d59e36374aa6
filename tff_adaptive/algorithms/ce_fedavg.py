"""CE-FedAvg: Communication-Efficient FedAvg — distributed Adam, compressed uploads.

Mills, Hu, Min, "Communication-Efficient Federated Learning for Wireless Edge
Intelligence in IoT", IEEE IoT Journal 2020 (thesis ch. 3); SPEC §6.

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

from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from tff_adaptive.aggregators import compression
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.algorithms import mfl


def build_ce_fedavg(model_fn: Callable[[], tff.learning.models.VariableModel], *,
                    client_learning_rate: float, sparsity: float, quantize: bool = True,
                    local_steps: int = 0, beta_1: float = 0.9, beta_2: float = 0.999,
                    epsilon: float = 1e-8, bias_correction: bool = True,
                    client_weighting: Optional[tff.learning.ClientWeighting] = None,
                    fb_flops_per_example: float = 0.0) -> tff.learning.templates.LearningProcess:
  """CE-FedAvg; Adam is bias-corrected by default (the thesis uses standard Adam)."""
  adam = biased_optimizers.BiasedOptimizer('adam', beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                                           bias_correction=bias_correction)
  return mfl.build_mfl(
      model_fn, optimizer=adam, client_learning_rate=client_learning_rate,
      local_steps=local_steps, client_weighting=client_weighting,
      upload_compression=compression.SharedIndexCompressionFactory(sparsity, quantize),
      upload_state_deltas=True, fb_flops_per_example=fb_flops_per_example)
