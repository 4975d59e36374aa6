"""Secure aggregation: TFF's `tff.learning.secure_aggregator`, per client only.

Its client part runs in TFF's `federated_secure_sum_bitwidth`: each client
quantises its (zeroed, clipped) Δ to integers that only the secure sum over
all clients reveals. That protection is the point of the aggregator, and a
compiled cohort program sums its clients in one process, so it has no program
form: a round with it runs per client (`per_client_reason`). TFF's native C++
context cannot run the secure sum either; bin/train runs it on TFF's test
context (`workflow.flags.algorithms.needs_secure_context`).
"""

import tensorflow_federated as tff

from tff_adaptive.aggregators import base


class SecureAggregator(base.FromTffLearning):
  """`tff.learning.secure_aggregator(zeroing=, clipping=, weighted=)`."""
  tff_builder = staticmethod(tff.learning.secure_aggregator)

  def per_client_reason(self) -> str:
    return f'the aggregator {self!r} runs per client'


def secure_aggregator(*, zeroing: bool = True, clipping: bool = True,
                      weighted: bool = True) -> SecureAggregator:
  """`tff.learning.secure_aggregator(zeroing=, clipping=, weighted=)`, per client only."""
  return SecureAggregator.of_kind(zeroing, clipping, weighted)
