"""Differential privacy: TFF's DP aggregator and the (ε, δ) it achieves.

Per-client L2 clipping of Δ to C and Gaussian noise of std σC on the sum, with
uniform weighting (seed 002's DP StackOverflow setting, SPEC §4), through
`tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed`. The privacy
loss is accounted with the RDP accountant of `dp_accounting` (shipped with
TFF) for Poisson-sampled Gaussian rounds with sampling rate q = clients per
round / population, composed over rounds.
"""

import dp_accounting
import tensorflow_federated as tff

RDP_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]


def dp_aggregator(noise_multiplier: float, clip_norm: float,
                  clients_per_round: int) -> tff.aggregators.UnweightedAggregationFactory:
  if noise_multiplier is None or noise_multiplier < 0:
    raise ValueError(f'dp_aggregator: noise_multiplier must be ≥ 0; got {noise_multiplier}')
  if clip_norm is None or not clip_norm > 0:
    raise ValueError(f'dp_aggregator: clip_norm must be > 0; got {clip_norm}')
  return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, clip=clip_norm)


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
