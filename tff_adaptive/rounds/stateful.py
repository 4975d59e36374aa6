"""Processes whose clients keep state across rounds (`Recipe.state_keeper`).

TFF's `LearningProcess` must return everything at SERVER, but a client's new
state (SCAFFOLD's control variate c_i) goes back to that client, so such a
round is a `StatefulClientsProcess`: TFF's `IterativeProcess` with the
`LearningProcess` accessors, whose `next(state, client_data)` takes, per
client, `OrderedDict(train=dataset, private=state)` and returns
`StatefulClientsOutput(state, metrics, clients)`, `clients` being the new
states in input order. The caller stores them between rounds (the training
loop: `tff_adaptive.personalization.client_state.ClientStateStore`, as for
MTFL's private weights, `extensions/private_weights.py`).
"""

import collections
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class StatefulClientsOutput(NamedTuple):
  state: Any
  metrics: Any
  clients: Any  # the clients' new states, one per input client, in input order


def flat_state(value, names=None) -> collections.OrderedDict:
  """A client state as name → np.ndarray, as the store keeps it: its leaves in
  `tf.nest.flatten` order named `names` (default `state_0`, `state_1`, ...)."""
  leaves = tf.nest.flatten(value)
  names = names or [f'state_{i}' for i in range(len(leaves))]
  return collections.OrderedDict((k, np.asarray(v)) for k, v in zip(names, leaves, strict=True))


class ClientStateProcess(tff.templates.IterativeProcess):
  """An `IterativeProcess` with the `LearningProcess` model-weight accessors.

  The base of every process whose clients take back per-client values.
  """

  def __init__(self, initialize_fn, next_fn, get_model_weights, set_model_weights,
               get_hparams=None, set_hparams=None):
    super().__init__(initialize_fn, next_fn)
    self._get_model_weights = get_model_weights
    self._set_model_weights = set_model_weights
    self._get_hparams = get_hparams
    self._set_hparams = set_hparams

  @property
  def get_model_weights(self) -> tff.Computation:
    return self._get_model_weights

  @property
  def set_model_weights(self) -> tff.Computation:
    return self._set_model_weights

  @property
  def get_hparams(self) -> tff.Computation:
    """state → OrderedDict(client_work=(η, K), ...=the server's hyperparameters)."""
    return self._get_hparams

  @property
  def set_hparams(self) -> tff.Computation:
    """(state, hparams of `get_hparams`) → state, as a LearningProcess's."""
    return self._set_hparams


class StatefulClientsProcess(ClientStateProcess):
  """A learning process whose clients bring and take back their own state.

  Attributes:
    client_state_initial: the state of a client that has not trained yet, as
      name → np.ndarray (`flat_state`); what a store returns for a new client.
    fingerprint: describes the algorithm for a client-state store.
    name: the algorithm.
  """

  def __init__(self, initialize_fn, next_fn, get_model_weights, set_model_weights, *,
               get_hparams_fn, set_hparams_fn, client_state_initial, client_state_structure,
               name):
    super().__init__(initialize_fn, next_fn, get_model_weights, set_model_weights,
                     get_hparams_fn, set_hparams_fn)
    self._structure = client_state_structure
    self.client_state_initial = client_state_initial
    self.name = name
    self.fingerprint = collections.OrderedDict(
        algorithm=name, private=[[k, list(v.shape), v.dtype.str]
                                 for k, v in client_state_initial.items()])

  @property
  def has_private_state(self) -> bool:
    return True

  def client_input(self, dataset, client_state) -> collections.OrderedDict:
    """One client's input to `next`: its dataset and its stored state (`flat_state` form)."""
    values = [np.asarray(client_state[k]) for k in self.client_state_initial]
    return collections.OrderedDict(
        train=dataset, private=tf.nest.pack_sequence_as(self._structure, values))

  def next(self, state, client_data) -> StatefulClientsOutput:
    output = super().next(state, client_data)
    return StatefulClientsOutput(output.state, output.metrics,
                                 [self.client_output(c) for c in output.clients])

  def client_output(self, value):
    """One client's output of the round as the caller keeps it (`flat_state`)."""
    return self.flat_state(value)

  def flat_state(self, value) -> collections.OrderedDict:
    """A client state structure in `client_state_initial`'s names."""
    return flat_state(value, list(self.client_state_initial))


class PersonalizedClientsProcess(StatefulClientsProcess):
  """The process of a recipe whose clients measure user accuracy (`extensions/user_accuracy.py`).

  `next(state, [process.client_input(train, client_state, test=test) ...])`:
  per client its training and test datasets (and its stored state, when its
  recipe keeps one); `output.clients[i]` is OrderedDict(ua=OrderedDict(correct,
  examples, loss_sum)[, private=its new state, `flat_state` form]).
  `evaluate_clients(state, client inputs)` measures the clients' UA with the
  state's model, without training.
  """

  def __init__(self, *args, evaluate_fn, **kwargs):
    super().__init__(*args, **kwargs)
    self._evaluate_fn = evaluate_fn

  @property
  def has_private_state(self) -> bool:
    return bool(self.client_state_initial)

  @property
  def private_initial(self) -> collections.OrderedDict:
    """A new client's state (`flat_state` form; empty: clients keep nothing)."""
    return self.client_state_initial

  def client_input(self, dataset, client_state=None, *, test) -> collections.OrderedDict:
    item = collections.OrderedDict(train=dataset, test=test)
    if self.has_private_state:
      item['private'] = super().client_input(dataset, client_state)['private']
    return item

  def client_output(self, value):
    output = collections.OrderedDict(ua=tf.nest.map_structure(np.asarray, value['ua']))
    if 'private' in value:
      output['private'] = self.flat_state(value['private'])
    return output

  def evaluate_clients(self, state, client_data) -> list:
    """Each client's OrderedDict(ua=...) with the state's model, before any training."""
    return [self.client_output(c) for c in self._evaluate_fn(state, client_data)]
