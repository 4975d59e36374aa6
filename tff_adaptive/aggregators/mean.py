"""The default aggregator: the example-weighted (or uniform) mean of Δ.

Per client, TFF's `MeanFactory` (Σ w·Δ / Σ w); when nothing else is
configured the per-client round fuses it into its single `federated_sum`
(`RoundOptions.fused_mean`), as the cohort program always does. Its program
form is `base.InProgram` unchanged: w·Δ and w per client, their quotient at
the server, no state, no measurements.
"""

import tensorflow_federated as tff

from tff_adaptive.aggregators import base


class Mean(base.Aggregator, tff.aggregators.WeightedAggregationFactory):
  """Σ w·Δ / Σ w (uniform weighting: w = 1)."""

  def __init__(self):
    self.tff_factory = tff.aggregators.MeanFactory()

  def in_program(self, sum_extra: bool) -> base.InProgram:
    return base.InProgram(self, sum_extra)
