"""Fixed-clip Gaussian DP: TFF's `DifferentiallyPrivateFactory.gaussian_fixed`.

Per-client L2 clipping of Δ to C and Gaussian noise of std σC on the sum,
divided by the expected clients per round, with uniform weighting (the
FedAda2 paper's DP StackOverflow setting, docs/algorithms.md#fedada2). The
(ε, δ) a run achieves is `accounting.privacy.epsilon`'s.

`GaussianFixed` keeps σ, C and clients_per_round as its own constructor
arguments: TFF's factory holds them only inside its tensorflow_privacy query,
and the cohort program needs them to clip, add noise and normalise inside its
compiled round (`InProgram`).
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# The DP process's state container: the cohort round must return the same one.
from tensorflow_federated.python.aggregators import differential_privacy as tff_dp

from tff_adaptive import errors
from tff_adaptive.aggregators import base


class GaussianFixed(base.Aggregator, tff.aggregators.UnweightedAggregationFactory):
  """`gaussian_fixed(noise_multiplier, clients_per_round, clip=clip_norm)`, with its parameters."""

  def __init__(self, noise_multiplier: float, clip_norm: float, clients_per_round: float):
    self.noise_multiplier = noise_multiplier
    self.clip_norm = clip_norm
    # (as gaussian_fixed converts it, for the same float32 denominator)
    self.clients_per_round = (float(clients_per_round) if isinstance(clients_per_round, int)
                              else clients_per_round)
    self.tff_factory = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, clip=clip_norm)

  def in_program(self, sum_extra: bool) -> base.InProgram:
    return InProgram(self, sum_extra)

  def __repr__(self):
    return (f'dp_aggregator(noise_multiplier={self.noise_multiplier}, '
            f'clip_norm={self.clip_norm}, clients_per_round={self.clients_per_round})')


def dp_aggregator(noise_multiplier: float, clip_norm: float,
                  clients_per_round: int) -> GaussianFixed:
  if noise_multiplier is None or noise_multiplier < 0:
    raise errors.ArgumentError('dp_aggregator', 'noise_multiplier',
                               f'must be ≥ 0; got {noise_multiplier}')
  if clip_norm is None or not clip_norm > 0:
    raise errors.ArgumentError('dp_aggregator', 'clip_norm', f'must be > 0; got {clip_norm}')
  return GaussianFixed(noise_multiplier, clip_norm, clients_per_round)


class InProgram(base.InProgram):
  """The DP query's arithmetic in the program.

  Per client, GaussianSumQuery.preprocess_record: Δ_i clipped to global L2
  norm C over all trainable tensors (`tf.clip_by_global_norm`). Summed
  unweighted (the round's weighting is uniform, `RoundOptions.weighting_for`;
  a dropped client's Δ is already zero). At the server, once per round:
  GaussianSumQuery.get_noised_result adds N(0, (σC)²) to every coordinate of
  the sum, NormalizedQuery divides by clients_per_round (a constant, not the
  cohort's size). The extra upload is averaged as in the per-client round.
  """
  not_in_population = 'fixed-clip DP has no population form yet (the mean has)'
  weighted_delta = False

  def __init__(self, aggregator: GaussianFixed, sum_extra: bool):
    super().__init__(aggregator, sum_extra)
    # The float32 values of the query's global state (GaussianSumQuery and
    # NormalizedQuery cast the Python numbers the same way).
    self.clip = np.float32(aggregator.clip_norm)
    self.stddev = np.float32(aggregator.clip_norm * aggregator.noise_multiplier)
    self.denominator = np.float32(aggregator.clients_per_round)

  def client_part(self, delta, extra, params):
    del params
    clipped, _ = tf.clip_by_global_norm(tf.nest.flatten(delta), self.clip)
    return tf.nest.pack_sequence_as(delta, clipped), extra, {}

  def means(self, sums):
    # TFF's expressions (tensorflow_privacy 0.9 gaussian_query / normalized_query).
    random_normal = tf.random_normal_initializer(stddev=self.stddev)
    noised = tf.nest.map_structure(
        lambda v: v + tf.cast(random_normal(tf.shape(v)), v.dtype), sums['weighted_delta'])
    mean_delta = tf.nest.map_structure(
        lambda v: tf.truediv(v, tf.cast(self.denominator, v.dtype)), noised)
    return mean_delta, None, None

  # The query's state does not change (fixed clip, constant DP event): as the
  # TFF process, the round only marks the state as no longer the initial one.
  def next_state(self, placement, aggregator_state):
    # np.False_ in process: the value TFF's own round returns there.
    not_initial = placement.value(np.False_ if placement.in_process else False)
    return placement.zip(tff_dp.DPAggregatorState(
        aggregator_state.query_state, aggregator_state.agg_state, aggregator_state.dp_event,
        not_initial))
