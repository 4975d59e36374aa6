"""The state layout every composer-built process shares, and TFF type helpers.

The state is a `tff.learning.templates.LearningAlgorithmState`:
  global_model_weights  x_t (`ModelWeights`),
  distributor           () (x_t and s_t go down in one broadcast),
  client_work           OrderedDict(learning_rate=η, local_steps=K): what
                        clients are told to run this round; schedules change it,
  aggregator            the Δ aggregator's state,
  finalizer             the recipe's server statistics s_t.
Both executions (per client, cohort) build exactly this state, so a run can
switch execution and resume from the same checkpoint.
"""

import collections
from collections.abc import Mapping
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

def hparams_type(client_hparams: Mapping[str, float] = ()) -> tff.StructWithPythonType:
  """`state.client_work`'s type: η, K and a recipe's `client_hparams`."""
  return tff.StructWithPythonType(
      [('learning_rate', np.float32), ('local_steps', np.int32)] +
      [(name, np.float32) for name in client_hparams], collections.OrderedDict)


# Without client hyperparameters: (η, K).
HPARAMS_TYPE = hparams_type()


def leaves(type_spec: tff.Type):
  if isinstance(type_spec, tff.TensorType):
    yield type_spec
  elif isinstance(type_spec, tff.StructType):
    for _, member in tff.structure.iter_elements(type_spec):
      yield from leaves(member)
  elif isinstance(type_spec, tff.FederatedType):
    yield from leaves(type_spec.member)
  else:
    raise TypeError(f'cannot count bits of {type_spec}')


def num_bits(type_spec: tff.Type) -> int:
  """Exact payload bits of a TFF type: Σ elements × dtype width."""
  return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize * 8
             for leaf in leaves(type_spec))


def zeros_like_specs(specs):
  return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)


def _initial_weights(model_fn):
  return tff.learning.models.ModelWeights.from_model(model_fn())


def initial_state_computation(model_fn, client_learning_rate: float, local_steps: int,
                              aggregator, init_stats,
                              client_hparams: Mapping[str, float] = ()) -> tff.Computation:
  """`initialize` of every composer-built (and personalised) process.

  `aggregator` is the Δ aggregation process, `init_stats` the TF computation
  of the recipe's s_0, `client_hparams` the recipe's (`Recipe.client_hparams`).
  """
  client_work = collections.OrderedDict(
      learning_rate=np.float32(client_learning_rate), local_steps=np.int32(local_steps),
      **{name: np.float32(value) for name, value in dict(client_hparams).items()})

  @tff.federated_computation
  def initialize_fn():
    weights = tff.federated_eval(
        tff.tensorflow.computation(lambda: _initial_weights(model_fn)), tff.SERVER)
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=weights,
        distributor=tff.federated_value((), tff.SERVER),
        client_work=tff.federated_value(client_work, tff.SERVER),
        aggregator=aggregator.initialize(),
        finalizer=tff.federated_eval(init_stats, tff.SERVER)))

  return initialize_fn


def model_weights_fns(state_type, weights_type):
  """TFF's `get_model_weights` / `set_model_weights` of a LearningAlgorithmState."""

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, weights):
    return state._replace(global_model_weights=weights)

  return get_model_weights, set_model_weights


def hparams_fns(state_type, recipe):
  """`get_hparams` / `set_hparams`: OrderedDict(client_work=(η, K), finalizer=server's)."""

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    server = (recipe.get_server_hparams(state.finalizer) if recipe.get_server_hparams
              else collections.OrderedDict())
    return collections.OrderedDict(client_work=state.client_work, finalizer=server)

  @tff.tensorflow.computation(state_type, get_hparams_fn.type_signature.result)
  def set_hparams_fn(state, hparams):
    finalizer = state.finalizer
    if recipe.set_server_hparams:
      finalizer = recipe.set_server_hparams(finalizer, hparams['finalizer'])
      finalizer = tf.nest.pack_sequence_as(state.finalizer, tf.nest.flatten(finalizer))
    return state._replace(client_work=hparams['client_work'], finalizer=finalizer)

  return get_hparams_fn, set_hparams_fn


def set_round_hparams(state, *, client_learning_rate: Optional[float] = None,
                      local_steps: Optional[int] = None):
  """Returns `state` with this round's η and/or K in `state.client_work`.

  The Python-side twin of `process.set_hparams` for the two client
  hyperparameters (no TFF invocation, so no copy of the whole state through
  the executor): what the round schedules use between rounds.
  """
  work = collections.OrderedDict(state.client_work)
  if client_learning_rate is not None:
    work['learning_rate'] = np.float32(client_learning_rate)
  if local_steps is not None:
    work['local_steps'] = np.int32(local_steps)
  return state._replace(client_work=work)


def runs_local_steps(state_or_type) -> bool:
  """Whether a process with this state (or state type) runs its K steps itself.

  True for the composer's and the personalised processes (K is
  `client_work['local_steps']`, set per round); False for TFF-built ones
  (Mimelite, FedProx), which train on whatever data they are given.
  """
  member = getattr(state_or_type, 'member', state_or_type)
  work = getattr(member, 'client_work', None)
  if isinstance(member, tff.StructType):
    names = [name for name, _ in tff.structure.iter_elements(member)]
    if 'client_work' not in names:
      return False
    work = member.client_work
    return isinstance(work, tff.StructType) and 'local_steps' in [
        name for name, _ in tff.structure.iter_elements(work)]
  return isinstance(work, Mapping) and 'local_steps' in work
