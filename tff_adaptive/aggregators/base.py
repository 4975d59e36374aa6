"""What an aggregator of this package is: a TFF factory and its cohort-program form.

Each aggregator is one object in one module (mean, dp, compression, robust,
secure), and the rounds ask it for both executions' aggregation:

  per client   `create_process(delta_type, extra_type)`: the `tff.aggregators`
               process over Δ (or over OrderedDict(delta=Δ, extra=extra) for
               an upload compression), whose client part TFF runs per client
               and whose server part once; its `initialize` is the state's
               `aggregator` in both executions, so checkpoints carry over
  cohort       `in_program(sum_extra)`: an `InProgram`, the same arithmetic
               split in two for the compiled program, which has no
               per-client TFF calls:

    client_params(state)       once per round, before the clients: what they
                               need of the aggregator's state (robust: the
                               norms), sent with the model
    client_part(Δ, extra, p)   per client, inside the program (vectorised or in
                               sequence, like the training): the (Δ, extra) the
                               round's sums take, and the sums it adds
    means(Σ)                   once per round, at the server: mean Δ (and mean
                               extra, measured bits, where it has its own)
    after_round(...)           once per round: the new state and the
                               measurements, in the process's layout

An aggregator that has no program form (`per_client_reason` says why, e.g.
secure aggregation) runs per client only. A plain `tff.aggregators` factory
passed to a builder is wrapped in `PerClient`: TFF's factory objects do not
say which arithmetic they hold, so it runs per client, its reason naming it.
"""

import collections
import functools
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

MODEL = 'aggregator'  # `model_aggregator`: aggregates Δ
UPLOAD = 'upload compression'  # `upload_compression`: aggregates (Δ, extra), measures the bits

NO_BITS = -1.0  # `RoundCosts.metrics`: no measured upload, count the dense payload


class Aggregator:
  """An aggregator: its TFF factory (`tff_factory`) and its program form.

  Subclasses are `tff.aggregators` factories too (`create` is their TFF
  factory's), so they go wherever TFF takes a factory.
  """
  role = MODEL
  tff_factory = None  # set by each aggregator's constructor

  @property
  def weighted(self) -> bool:
    """Whether its process takes the clients' weights (TFF's weighted factories)."""
    return isinstance(self.tff_factory, tff.aggregators.WeightedAggregationFactory)

  @property
  def joint(self) -> bool:
    """It aggregates OrderedDict(delta=Δ, extra=extra) together and measures
    `upload_bits_per_client`."""
    return self.role == UPLOAD

  def create(self, *types) -> tff.templates.AggregationProcess:
    return self.tff_factory.create(*types)

  def create_process(self, delta_type, extra_type) -> tff.templates.AggregationProcess:
    """The process both executions aggregate Δ (and, if `joint`, extra) with."""
    weight_type = tff.TensorType(np.float32)
    if self.joint:
      joint_type = tff.StructWithPythonType([('delta', delta_type), ('extra', extra_type)],
                                            collections.OrderedDict)
      return self.tff_factory.create(joint_type, weight_type)
    if self.weighted:
      return self.tff_factory.create(delta_type, weight_type)
    return self.tff_factory.create(delta_type)

  def per_client_reason(self) -> Optional[str]:
    """Why the cohort program cannot run it (None: `in_program` gives its form)."""
    return None

  def in_program(self, sum_extra: bool) -> 'InProgram':
    """Its form in one cohort program build (`sum_extra`: `Recipe.sum_extra`)."""
    raise NotImplementedError(self.per_client_reason())


class PerClient(Aggregator):
  """A `tff.aggregators` factory this package did not build: runs per client."""

  def __init__(self, factory, role: str):
    self.tff_factory, self.role = factory, role

  def per_client_reason(self) -> str:
    return f'the {self.role} {type(self.tff_factory).__name__} runs per client'


class FromTffLearning(Aggregator):
  """One of TFF's `tff.learning` aggregators, `tff_builder(zeroing=, clipping=,
  weighted=)`, with the choices it was built with (TFF's factory keeps none)."""
  tff_builder = None  # staticmethod(tff.learning.<name>_aggregator)

  def __init__(self, zeroing: bool, clipping: bool, weighted: bool):
    self.zeroing, self.clipping = zeroing, clipping  # (`weighted`: TFF's factory's kind)
    self.tff_factory = self.tff_builder(zeroing=zeroing, clipping=clipping, weighted=weighted)

  @classmethod
  def of_kind(cls, zeroing: bool, clipping: bool, weighted: bool) -> 'FromTffLearning':
    """An instance that is a weighted or unweighted `tff.aggregators` factory, as
    TFF's is: builders choose the weighting by that kind."""
    return _of_kind(cls, weighted)(zeroing, clipping, weighted)

  def __repr__(self):
    return (f'{self.tff_builder.__name__}(zeroing={self.zeroing}, clipping={self.clipping}, '
            f'weighted={self.weighted})')


@functools.lru_cache(maxsize=None)
def _of_kind(cls, weighted: bool):
  kind = (tff.aggregators.WeightedAggregationFactory if weighted
          else tff.aggregators.UnweightedAggregationFactory)
  return type(('Weighted' if weighted else 'Unweighted') + cls.__name__, (cls, kind), {})


def ours(factory, role: str) -> Aggregator:
  """`factory` as an `Aggregator` in `role`: itself if it is one of ours built
  for that role, else wrapped to run per client (as it aggregates there)."""
  if isinstance(factory, Aggregator) and factory.role == role:
    return factory
  return PerClient(factory, role)


class InProgram:
  """An aggregator's parts in one cohort program (see module docstring).

  The defaults are the plain (example-weighted or uniform) mean, which keeps
  no state and measures nothing: Σ w·Δ / Σ w, what the default per-client
  round's single `federated_sum` computes. Built per program build: forms may
  keep what the build's types determine (robust: its measurements' layout).
  """
  weighted_delta = True  # the sums hold Σ w·Δ; False: Σ Δ (an unweighted sum)
  # Why a population of runs (rounds/population.py) cannot aggregate with this
  # form (None: it can); its server part runs once per member there.
  not_in_population: Optional[str] = None

  def __init__(self, aggregator: Aggregator, sum_extra: bool):
    self.aggregator = aggregator
    self.sum_extra = sum_extra

  def client_params_type(self):
    """The TFF type of `client_params` (None: the clients need nothing of the state)."""
    return None

  def client_params(self, aggregator_state):
    del aggregator_state
    return ()

  def client_part(self, delta, extra, params):
    """One client's (Δ, extra) as the round's sums take them, and the sums it adds."""
    del params
    return delta, extra, collections.OrderedDict()

  def process(self, delta_type, extra_type) -> tff.templates.AggregationProcess:
    """The per-client round's process: its `initialize` gives the state's `aggregator`."""
    return self.aggregator.create_process(delta_type, extra_type)

  def means(self, sums):
    """(mean Δ, mean extra, measured upload bits) from the round's sums; None
    for the round's own mean extra (`Recipe.sum_extra`-aware) or bits (none)."""
    mean = lambda t: tf.math.divide_no_nan(t, sums['weight'])
    return tf.nest.map_structure(mean, sums['weighted_delta']), None, None

  def after_round(self, placement, process, aggregator_state, sums, round_metrics):
    """(the aggregator's new state, its measurements), placed as the round's
    steps are (`skeleton.Placement`: at SERVER, or in this process in TFF's
    Python containers)."""
    del sums
    return (self.next_state(placement, aggregator_state),
            self.measurements(placement, process, round_metrics))

  def next_state(self, placement, aggregator_state):
    del placement
    return aggregator_state

  def measurements(self, placement, process, round_metrics):
    del round_metrics
    return placement.value(tensor_free_value(process.next.type_signature.result.measurements))


def tensor_free_value(type_spec: tff.Type):
  """The value of a type without tensors (nested empty structures)."""
  if isinstance(type_spec, tff.FederatedType):
    type_spec = type_spec.member
  elements = list(tff.structure.iter_elements(type_spec))
  if all(name for name, _ in elements) and elements:
    return collections.OrderedDict((name, tensor_free_value(t)) for name, t in elements)
  return tuple(tensor_free_value(t) for _, t in elements)
