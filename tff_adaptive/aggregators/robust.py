"""`tff.learning.robust_aggregator`, kept recognisable for the cohort program.

`robust_aggregator(zeroing=, clipping=, weighted=)` returns a factory whose
`create` is TFF's own `tff.learning.robust_aggregator(...)` (so the per-client
round aggregates with TFF's process, and both executions start from its
`initialize`), and which records what it was built with. TFF's factory is an
instance of a class local to `tff.aggregators.robust._make_wrapper` whose norm
estimators exist only as TFF computations: nothing in it says which
multiplier, increment or norm it uses, so the cohort program
(`rounds/cohort_aggregation.Robust`) runs this factory in the program, and a
factory from `tff.learning.robust_aggregator` itself per client.

The parameters of TFF's default norm processes (TFF 0.87,
`model_update_aggregator._default_zeroing` / `_default_clipping`), as
`PrivateQuantileEstimationProcess.no_noise` builds them: a
`NoPrivacyQuantileEstimatorQuery` with geometric updates, its report mapped to
multiplier·C + increment. The initial estimate, target quantile and learning
rate travel in the process state, so the cohort reads those from the state.
"""

import dataclasses
import math

import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class NormEstimate:
  """One adaptive norm: a no-noise quantile estimate of the clients' norms."""
  prefix: str             # TFF's state and measurement names: prefix + 'ing_norm', ...
  norm_order: float       # the norm compared with the estimate (TFF: inf for zeroing, 2 clipping)
  initial_estimate: float
  target_quantile: float
  learning_rate: float
  multiplier: float = 1.0
  increment: float = 0.0


ZEROING = NormEstimate('zero', math.inf, 10.0, 0.98, math.log(10.0), multiplier=2.0,
                       increment=1.0)
CLIPPING = NormEstimate('clipp', 2.0, 1.0, 0.8, 0.2)


class RobustFactory:
  """What `robust_aggregator` built; `create` is TFF's factory's."""

  def __init__(self, zeroing: bool, clipping: bool, weighted: bool):
    self.zeroing, self.clipping, self.weighted = zeroing, clipping, weighted
    self.tff_factory = tff.learning.robust_aggregator(zeroing=zeroing, clipping=clipping,
                                                      weighted=weighted)

  @property
  def norms(self) -> tuple[NormEstimate, ...]:
    """The adaptive norms, outermost first (TFF wraps zeroing around clipping)."""
    return (ZEROING,) * self.zeroing + (CLIPPING,) * self.clipping

  def create(self, *types):
    return self.tff_factory.create(*types)

  def __repr__(self):
    return (f'robust_aggregator(zeroing={self.zeroing}, clipping={self.clipping}, '
            f'weighted={self.weighted})')


class WeightedRobustAggregator(RobustFactory, tff.aggregators.WeightedAggregationFactory):
  pass


class UnweightedRobustAggregator(RobustFactory, tff.aggregators.UnweightedAggregationFactory):
  pass


def robust_aggregator(*, zeroing: bool = True, clipping: bool = True,
                      weighted: bool = True) -> RobustFactory:
  """`tff.learning.robust_aggregator(zeroing=, clipping=, weighted=)` (see module docstring)."""
  cls = WeightedRobustAggregator if weighted else UnweightedRobustAggregator
  return cls(zeroing, clipping, weighted)
