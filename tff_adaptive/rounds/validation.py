"""Checks of the arguments every builder shares, made as TFF's builders make them.

TFF's `build_weighted_fed_avg` raises TypeError for a `client_weighting` that
is not a `tff.learning.ClientWeighting`, an aggregator that is not an
aggregation factory, and a `model_fn` whose call returns something other than
a `tff.learning.models.VariableModel`. Without these checks a string weighting
was silently uniform and `lambda: 0` failed deep inside the build with an
AttributeError.

"""

from collections.abc import Callable
from typing import Any

import tensorflow_federated as tff


def returning_a_model(model_fn: Callable[[], Any],
                      builder: str) -> Callable[[], tff.learning.models.VariableModel]:
  """`model_fn`, wrapped so that a call returning a non-model raises TypeError naming it.

  The check runs where the model is first built (as in TFF, inside the build),
  not here: calling `model_fn` once more only to check it would build the
  model twice.
  """

  def checked_model_fn():
    model = model_fn()
    if not isinstance(model, tff.learning.models.VariableModel):
      raise TypeError(f'{builder}: model_fn must return a tff.learning.models.VariableModel; '
                      f'it returned {type(model).__name__}')
    return model

  return checked_model_fn


def check_client_weighting(client_weighting: Any, builder: str) -> None:
  """TypeError unless `client_weighting` is None (the builder's default) or a ClientWeighting."""
  if client_weighting is not None and not isinstance(client_weighting,
                                                     tff.learning.ClientWeighting):
    raise TypeError(f'{builder}: client_weighting must be a tff.learning.ClientWeighting '
                    f'(e.g. tff.learning.ClientWeighting.NUM_EXAMPLES) or None; got '
                    f'{client_weighting!r}')


def check_aggregator(factory: Any, name: str, builder: str, weighted_only: bool = False) -> None:
  """TypeError unless `factory` is None or an aggregation factory (weighted, if `weighted_only`)."""
  kinds = ((tff.aggregators.WeightedAggregationFactory,) if weighted_only else
           (tff.aggregators.WeightedAggregationFactory,
            tff.aggregators.UnweightedAggregationFactory))
  if factory is not None and not isinstance(factory, kinds):
    wanted = ' or '.join(f'tff.aggregators.{k.__name__}' for k in kinds)
    raise TypeError(f'{builder}: {name} must be a {wanted} or None; got '
                    f'{type(factory).__name__}')


def check_weighting(client_weighting: Any, model_aggregator: Any, upload_compression: Any,
                    builder: str) -> None:
  """The weighting arguments of `composer.build_process` (TypeError naming the first bad one)."""
  check_client_weighting(client_weighting, builder)
  check_aggregator(model_aggregator, 'model_aggregator', builder)
  check_aggregator(upload_compression, 'upload_compression', builder, weighted_only=True)
