"""`RoundOptions`: how a round is aggregated, measured and executed.

The same for every composer-built algorithm, so the builders pass one object
instead of repeating the keywords; TFF's own keywords keep TFF's names.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional, Union

import tensorflow_federated as tff

from tff_adaptive.aggregators import base as aggregator_base
from tff_adaptive.aggregators import mean

EXECUTIONS = ('per_client', 'cohort')


@dataclasses.dataclass(frozen=True)
class RoundOptions:
  """Options every composer-built builder accepts (as keywords).

  Attributes:
    client_weighting: overrides the algorithm's default weighting.
    model_distributor: not supported (ValueError): the round broadcasts x_t,
      the clients' share of s_t and (η, K) as one message.
    model_aggregator: a `tff.aggregators` factory for Δ. Weighted factories
      get the client weights; unweighted ones (e.g. TFF's DP factories) imply
      uniform weighting. Default: the example-weighted mean. The package's
      aggregators (`tff_adaptive.aggregators`: dp, robust, secure) run in
      both executions where they can; any other factory runs per client
      (`aggregator`).
    metrics_aggregator: as in TFF's builders; None (or
      `tff.learning.metrics.sum_then_finalize`): summed in the round's single
      `federated_sum`, then finalized.
    loop_implementation: the per-client loop over batches; None:
      `DATASET_ITERATOR` (~3x cheaper per client than `DATASET_REDUCE` in TFF's
      C++ executor, docs/performance.md).
    upload_compression: a factory aggregating `OrderedDict(delta=Δ,
      extra=extra)` together and measuring `upload_bits_per_client` (e.g.
      `aggregators.compression.SharedIndexCompressionFactory`); replaces
      `model_aggregator`.
    fb_flops_per_example: forward+backward FLOPs per example (docs/algorithms.md#costs); None:
      counted from the model's Keras model, or the FLOP metrics left out.
    measure_client_drift: report `client_drift/*` (accounting/drift.py).
    execution: 'per_client' (each client a call of a TFF computation),
      'cohort' (the whole cohort as one compiled program,
      `tff_adaptive.rounds.cohort`), or a `cohort.CohortExecution`.
  """
  client_weighting: Optional[tff.learning.ClientWeighting] = None
  model_distributor: Any = None
  model_aggregator: Optional[tff.aggregators.AggregationFactory] = None
  metrics_aggregator: Optional[Callable[..., tff.Computation]] = None
  loop_implementation: Optional[tff.learning.LoopImplementation] = None
  upload_compression: Optional[tff.aggregators.WeightedAggregationFactory] = None
  fb_flops_per_example: Optional[float] = None
  measure_client_drift: bool = False
  execution: Union[str, Any] = 'per_client'

  def __post_init__(self):
    # (argument types: tff_adaptive/rounds/validation.py, as TFF's builders check them)
    loop = self.loop_implementation
    if loop is not None and not isinstance(loop, tff.learning.LoopImplementation):
      raise TypeError('loop_implementation must be a tff.learning.LoopImplementation; got '
                      f'{loop!r}')
    if isinstance(self.execution, str) and self.execution not in EXECUTIONS:
      raise ValueError(f'execution must be one of {", ".join(EXECUTIONS)} or a CohortExecution; '
                       f'got {self.execution!r}')
    if self.upload_compression is not None and self.model_aggregator is not None:
      raise ValueError('upload_compression cannot be combined with another model_aggregator '
                       '(e.g. DP): both aggregate Δ')
    if self.model_distributor is not None:
      raise ValueError('model_distributor is not supported: the round sends the model, the '
                       'server optimiser state and (η, K) to the clients as one broadcast')

  @property
  def weighted(self) -> bool:
    """Whether Δ is aggregated with client weights."""
    return self.model_aggregator is None or isinstance(
        self.model_aggregator, tff.aggregators.WeightedAggregationFactory)

  @property
  def aggregator(self) -> aggregator_base.Aggregator:
    """Δ's aggregator: `upload_compression`, `model_aggregator` or the mean. A
    factory that is not one of the package's aggregators for its role is
    wrapped to run per client (`aggregators.base.PerClient`)."""
    if self.upload_compression is not None:
      return aggregator_base.ours(self.upload_compression, aggregator_base.UPLOAD)
    if self.model_aggregator is not None:
      return aggregator_base.ours(self.model_aggregator, aggregator_base.MODEL)
    return mean.Mean()

  @property
  def fused_mean(self) -> bool:
    """The default example-weighted mean, fused into the round's one federated_sum."""
    return (self.model_aggregator is None and self.upload_compression is None and
            self.metrics_aggregator is None)

  def weighting_for(self, recipe) -> tff.learning.ClientWeighting:
    if not self.weighted:
      # Δ is averaged uniformly: the extra uploads (MFL's optimiser states,
      # MimeXlite's gradients, FedGBO's ḡ) must be averaged the same way.
      if self.client_weighting not in (None, tff.learning.ClientWeighting.UNIFORM):
        raise ValueError(f'{recipe.name}: client_weighting={self.client_weighting.name} '
                         'contradicts an unweighted model_aggregator (it averages uniformly)')
      return tff.learning.ClientWeighting.UNIFORM
    return self.client_weighting or recipe.weighting
