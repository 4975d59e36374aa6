"""Differential privacy: TFF's DP aggregator and the (ε, δ) it achieves.

Per-client L2 clipping of Δ to C and Gaussian noise of std σC on the sum, with
uniform weighting (the FedAda2 paper's DP StackOverflow setting, docs/algorithms.md#fedada2), through
`tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed`. The privacy
loss is accounted with the RDP accountant of `dp_accounting` (shipped with
TFF) for Poisson-sampled Gaussian rounds with sampling rate q = clients per
round / population, composed over rounds.
"""

import dp_accounting
import tensorflow_federated as tff

from tff_adaptive import errors

RDP_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]


class GaussianFixedFactory(tff.aggregators.DifferentiallyPrivateFactory):
  """TFF's `gaussian_fixed` DP factory that also keeps its three parameters.

  It IS TFF's factory (the per-client round aggregates through it unchanged);
  the attributes let the cohort program recognise it and apply the same
  clipping, noise and normalisation inside its compiled round
  (`rounds/cohort_aggregation.py`), which it cannot do from the opaque query.
  """
  noise_multiplier: float
  clip_norm: float
  clients_per_round: float


def dp_aggregator(noise_multiplier: float, clip_norm: float,
                  clients_per_round: int) -> GaussianFixedFactory:
  if noise_multiplier is None or noise_multiplier < 0:
    raise errors.ArgumentError('dp_aggregator', 'noise_multiplier',
                               f'must be ≥ 0; got {noise_multiplier}')
  if clip_norm is None or not clip_norm > 0:
    raise errors.ArgumentError('dp_aggregator', 'clip_norm', f'must be > 0; got {clip_norm}')
  # `gaussian_fixed` is a classmethod building `cls(query)`: an instance of the subclass.
  factory = GaussianFixedFactory.gaussian_fixed(
      noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, clip=clip_norm)
  factory.noise_multiplier = noise_multiplier
  factory.clip_norm = clip_norm
  # (as gaussian_fixed converts it, for the same float32 denominator)
  factory.clients_per_round = (float(clients_per_round) if isinstance(clients_per_round, int)
                               else clients_per_round)
  return factory


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
