"""Differential privacy: the (ε, δ) that fixed-clip Gaussian DP rounds achieve.

The aggregator (per-client L2 clipping of Δ to C, Gaussian noise of std σC on
the sum) is `aggregators.dp.dp_aggregator`. The privacy loss is accounted
with the RDP accountant of `dp_accounting` (shipped with TFF) for
Poisson-sampled Gaussian rounds with sampling rate q = clients per round /
population, composed over rounds.
"""

import dp_accounting

RDP_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]


def epsilon(noise_multiplier: float, sampling_rate: float, rounds: int, delta: float) -> float:
  """ε after `rounds` Poisson-sampled Gaussian rounds (RDP accountant)."""
  if rounds == 0:
    return 0.0
  if noise_multiplier == 0:
    return float('inf')
  accountant = dp_accounting.rdp.RdpAccountant(RDP_ORDERS)
  event = dp_accounting.PoissonSampledDpEvent(
      sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier))
  accountant.compose(event, rounds)
  return float(accountant.get_epsilon(delta))
