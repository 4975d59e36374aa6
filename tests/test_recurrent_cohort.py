"""Recurrent cohorts vectorised across clients (tff_adaptive/rounds/recurrent.py).

A tiny GRU and a tiny LSTM (6 positions, Embedding(mask_zero=True) as the
Shakespeare models), 3 clients of unequal sizes with partial batches: the
vectorised cohort (the lane axis on the weights, lanes.py; or, for a GRU
without reset_after, the layers unrolled under `tf.vectorized_map`) equals the
per-client round within 1e-5 over 2 rounds, weights, server state and metrics
(also Mime Lite's full-gradient pass, and SCAFFOLD's per-client state);
building the unrolled one never asks pfor to convert a while loop (the step
loop is outside the vectorised code); `auto` picks the lanes where the model
has them; a model with neither keeps its clients in sequence, and
'vectorized' is then refused in one line.
"""

import collections
import importlib
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import mimelite
from tff_adaptive.algorithms import scaffold
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data
from tff_adaptive.rounds import recurrent

# The module (its package exports a function of the same name): the spy's target.
pfor_lib = importlib.import_module('tensorflow.python.ops.parallel_for.pfor')

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]

T, V, B = 6, 9, 4


def _model_fn(layer, length=T):
  def model_fn():
    spec = collections.OrderedDict(x=tf.TensorSpec([None, length], tf.int32),
                                   y=tf.TensorSpec([None, length], tf.int32))
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(length,)),
        tf.keras.layers.Embedding(V, 3, mask_zero=True,
                                  embeddings_initializer=tf.keras.initializers.RandomNormal(
                                      seed=1)),
        layer(5, return_sequences=True,
              kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2),
              recurrent_initializer=tf.keras.initializers.Orthogonal(seed=3)),
        tf.keras.layers.Dense(V, kernel_initializer=tf.keras.initializers.GlorotUniform(
            seed=4))])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=spec, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
  return model_fn


def _datasets(sizes=(7, 13, 3)):
  rng = np.random.default_rng(0)  # zeros (masked tokens) inside the sequences
  return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.integers(0, V, (n, T)).astype(np.int32),
      y=rng.integers(0, V, (n, T)).astype(np.int32))).batch(B) for n in sizes]


def _build(model_fn, local_steps, **execution):
  sgd = tff.learning.optimizers.build_sgdm(0.5)
  kwargs = {'execution': cohort.CohortExecution(**execution)} if execution else {}
  return fedopt.build_fedavg(model_fn, sgd, local_steps=local_steps, **kwargs)


def _assert_equal(a, b, what):
  for name, x, y in (('state', a.state, b.state), ('metrics', a.metrics, b.metrics)):
    for u, v in zip(tf.nest.flatten(x), tf.nest.flatten(y), strict=True):
      np.testing.assert_allclose(np.asarray(v, np.float64), np.asarray(u, np.float64),
                                 rtol=1e-5, atol=1e-5, err_msg=f'{what}: {name}')


def _unrolled_gru(*args, **kwargs):
  """A GRU without a lane form (reset_after=False): vectorised unrolled, through pfor."""
  return tf.keras.layers.GRU(*args, reset_after=False, **kwargs)


@pytest.mark.parametrize('layer, local_steps, mode, jit_compile', [
    (tf.keras.layers.GRU, 2, 'auto', False),  # the lanes
    (tf.keras.layers.LSTM, 0, 'auto', 'auto'),  # the lanes; epochs: 1-4 batches, padded steps
    (tf.keras.layers.GRU, 1, 'vectorized', 'step'),  # the lanes, XLA over each step
    (_unrolled_gru, 2, 'vectorized', False),  # unrolled, pfor
])
def test_vectorised_recurrent_cohort_equals_the_per_client_round(layer, local_steps, mode,
                                                                 jit_compile, monkeypatch):
  model_fn = _model_fn(layer)
  per_client = _build(model_fn, local_steps)
  converted = _spy_on_while_conversions(monkeypatch)
  fast = _build(model_fn, local_steps, mode=mode, jit_compile=jit_compile)
  assert isinstance(fast, cohort.CohortProcess) and fast.vectorized
  assert not converted, f'pfor converted {converted}'  # see the test after the next ones
  datasets = _datasets()
  state = per_client.initialize()
  for r in range(2):
    expected = per_client.next(state, datasets)
    shards = fast.make_shards([cohort_data.client_batches(ds, local_steps) for ds in datasets])
    actual = fast.next(state, shards)
    _assert_equal(expected, actual, f'{layer.__name__} round {r + 1}')
    state = expected.state


def test_vectorised_recurrent_mimelite_equals_the_per_client_round():
  """Mime Lite adds the full-gradient pass at x_t (`Recipe.full_gradient`): a
  second step loop, vectorised like the training one, epochs with padded steps."""
  model_fn = _model_fn(tf.keras.layers.GRU)
  build = lambda **kw: mimelite.build_mimelite(
      model_fn, tff.learning.optimizers.build_sgdm(0.5, momentum=0.9), local_steps=0, **kw)
  per_client, fast = build(), build(execution=cohort.CohortExecution(mode='vectorized'))
  assert fast.vectorized
  datasets = _datasets()
  state = per_client.initialize()
  expected = per_client.next(state, datasets)
  actual = fast.next(state, fast.make_shards([cohort_data.client_batches(ds, 0)
                                              for ds in datasets]))
  _assert_equal(expected, actual, 'mimelite')


def test_vectorised_recurrent_scaffold_equals_the_per_client_round():
  """SCAFFOLD's clients keep c_i: stacked into the shard, each client's loop
  starts from its own, and the new ones come back per client. Two rounds on the
  same clients, so the second starts from non-zero c_i. The shortest client
  first: the lanes run longest first, so each lane's c_i must follow it."""
  model_fn = _model_fn(tf.keras.layers.GRU)
  build = lambda **kw: scaffold.build_scaffold(
      model_fn, tff.learning.optimizers.build_sgdm(0.5), tff.learning.optimizers.build_sgdm(1.0),
      local_steps=2, total_clients=3, **kw)
  per_client, fast = build(), build(execution=cohort.CohortExecution(mode='vectorized'))
  assert fast.vectorized
  datasets = _datasets((3, 13, 7))
  state = fast_state = per_client.initialize()
  states = fast_states = [per_client.client_state_initial] * len(datasets)
  for r in range(2):
    expected = per_client.next(state, [per_client.client_input(d, c)
                                       for d, c in zip(datasets, states)])
    shards = fast.make_shards([cohort_data.client_batches(ds, 2) for ds in datasets])
    actual = fast.next(fast_state, fast.with_client_states(shards, fast_states))
    _assert_equal(expected, actual, f'scaffold round {r + 1}')
    for i, (a, b) in enumerate(zip(expected.clients, actual.clients, strict=True)):
      for u, v in zip(a.values(), b.values(), strict=True):
        np.testing.assert_allclose(np.asarray(v), np.asarray(u), rtol=1e-5, atol=1e-5,
                                   err_msg=f'c_{i} round {r + 1}')
    state, fast_state = expected.state, actual.state
    states, fast_states = expected.clients, actual.clients
  assert max(np.max(np.abs(np.asarray(v))) for v in fast_states[0].values()) > 1e-3


def _spy_on_while_conversions(monkeypatch) -> list:
  """The names of the while loops pfor converts from now on (in this test)."""
  converted = []
  original = pfor_lib.WhileV2.__call__

  def spy(self):
    converted.append(self._pfor_input.op.name)  # pylint: disable=protected-access
    return original(self)

  monkeypatch.setattr(pfor_lib.WhileV2, '__call__', spy)
  return converted


def test_the_vectorised_program_converts_no_while_loop(monkeypatch):
  """pfor converting the client's step loop (its `While` converter, which
  rebuilds the converted body inside a new loop) is what did not finish in
  14 minutes for the Shakespeare GRU; the program vectorises each step inside
  the loop instead, so pfor meets no while loop in the unrolled model: neither
  in FedAvg's steps (the equality test's unrolled case above) nor in Mime Lite's
  full-gradient pass before them."""
  converted = _spy_on_while_conversions(monkeypatch)
  assert mimelite.build_mimelite(
      _model_fn(_unrolled_gru), tff.learning.optimizers.build_sgdm(0.5), local_steps=2,
      execution=cohort.CohortExecution(mode='vectorized')).vectorized
  assert not converted, f'pfor converted {converted}'
  # The spy sees a while loop that pfor does convert (the test can fail).
  tf.function(lambda x: tf.vectorized_map(
      lambda v: tf.while_loop(lambda i, _: i < 2, lambda i, a: (i + 1, a * v), (0, v))[1],
      x)).get_concrete_function(tf.TensorSpec([3], tf.float32))
  assert converted


def test_layers_without_a_lane_form_or_static_length_stay_in_sequence_and_vectorized_is_refused():
  model_fn = _model_fn(_unrolled_gru, length=None)
  assert not _build(model_fn, 1, mode='auto').vectorized
  with pytest.raises(ValueError, match="mode='vectorized' cannot vectorise the recurrent"):
    _build(model_fn, 1, mode='vectorized')
  # The lanes need no static length: the same GRU with reset_after vectorises.
  assert _build(_model_fn(tf.keras.layers.GRU, length=None), 1, mode='auto').vectorized


@pytest.mark.parametrize('lanes, conv, mode, jit_compile, blocked, expected', [
    (True, False, 'auto', 'auto', False, True),  # the lane form: picked
    (True, False, 'auto', 'step', False, False),  # XLA asked for: in sequence
    (True, True, 'auto', 'auto', False, False),  # convolutions
    (True, False, 'auto', 'auto', True, False),  # an extension needs the clients one by one
    (False, False, 'auto', 'auto', False, False),  # unrolled only: never by auto
    (False, False, 'vectorized', 'auto', False, True),  # asked for
    (True, False, 'sequential', 'auto', False, False),
])
def test_auto_vectorises_recurrent_models_with_a_lane_form(lanes, conv, mode, jit_compile,
                                                           blocked, expected):
  view = types.SimpleNamespace(has_rnn=True, has_conv=conv, has_conv_or_rnn=True,
                               lane_model=object() if lanes else None,
                               rnn_vectorise_reason=None)
  ext = types.SimpleNamespace(steps_outside_unsupported='needs them' if blocked else None)
  assert recurrent.vectorise(mode, view, jit_compile, [ext]) is expected
  assert cohort.resolved_jit_compile('auto', view, 10, expected) == (
      recurrent.AUTO_JIT_COMPILE if expected else 'step')
