"""One client's round as three pure functions (FedJAX's client_init/step/final).

  carry  = loop.init(x_t, broadcast(s_t)[, state])  y_0 = x_t (as the extensions start
                                                   it), local = init_local(…)
  carry  = loop.before_steps(carry, passes)        the extensions' work before training
                                                   (a pass at x_t, user accuracy)
  carry  = loop.step(carry, g_k, loss_k, n_k, h)   one step: the recipe's local_step, g_k at
                                                   loop.gradient_point(carry) (y) on its
                                                   (first) batch, h the round's hparams (η
                                                   and the recipe's client_hparams), the
                                                   extensions' keywords
  result = loop.final(carry, x_t)                  Δ_i = x_t − y_K, extra_i, weight_i, and
                                                   what goes back to the client (its new
                                                   state, what it measured)
  output = loop.client_output(result)              that, in the process's form
  sums   = client_sums(result, metrics, …)         what is summed over clients

Executions differ only in how they get g_k (and in the `extension.ClientPasses`
they hand the extensions): the per-client TFF computation reads it from the
model's variables, the cohort program from a functional view of the model
(`functional.py`), over many clients at once. Nothing of an algorithm is
written here: `recipe.init_local`, `local_step` and `upload` are, and its
extensions' hooks (`extension.py`).
"""

import collections
from typing import Any, NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.accounting import drift
from tff_adaptive.rounds import extension as extension_lib
from tff_adaptive.rounds import recipe as recipe_lib

DRIFT_KEYS = ('drift_delta_sum', 'drift_delta_n', 'drift_model_sum', 'drift_model_n')


class ClientResult(NamedTuple):
  delta: list          # Δ_i (zeroed when non-finite)
  extra: Any           # the recipe's extra upload, float32
  weight: tf.Tensor    # the client's aggregation weight (0 when Δ_i is non-finite)
  stats: Any           # OrderedDict of counters (first_minibatch_loss, local_steps, ...)
  # What goes back to the client, by name: 'private' (its new state, from the
  # recipe's state keeper), and what extensions measured ('ua', ...).
  outputs: Any = ()


def tuples(structure):
  """Lists → tuples: loop state would stack a list into one tensor."""
  if isinstance(structure, (list, tuple)):
    return tuple(tuples(x) for x in structure)
  if isinstance(structure, dict):
    return type(structure)((k, tuples(v)) for k, v in structure.items())
  return structure


def zero_if_non_finite(tensors):
  """(tensors, non_finite): all zeros when any value is NaN or ±inf."""
  non_finite = tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors]))
  return [tf.where(non_finite, tf.zeros_like(t), t) for t in tensors], non_finite


def client_weight(num_examples, non_finite, weighting: tff.learning.ClientWeighting):
  """The aggregation weight: examples or 1; 0 for a client whose update is dropped."""
  if weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
    weight = tf.cast(num_examples, tf.float32)
  else:
    weight = tf.constant(1.0)
  return tf.where(non_finite, 0.0, weight)


class ClientLoop:
  """The recipe's client side, as functions of tensors only; the recipe's
  extensions' hooks (`rounds.extension`) run at their points."""

  def __init__(self, recipe: recipe_lib.Recipe, weighting: tff.learning.ClientWeighting,
               measure_client_drift: bool = False, branchless: bool = False):
    self.recipe = recipe
    self.extensions = recipe.extensions
    self.keeper = recipe.state_keeper
    self.split = recipe.weights_split
    self.weighting = weighting
    self.measure_client_drift = measure_client_drift
    # Under tf.vectorized_map a per-client tf.cond becomes a DynamicStitch,
    # which XLA cannot compile (jit_compile='program'): hooks that branch per
    # client select instead when the cohort's vectorised program asks.
    self.branchless = branchless

  def start_weights(self, x_t, n_t=(), client_state=()):
    """(y_0, n_0): x_t and the non-trainable weights as the extensions start the
    client (e.g. with its private weights patched in)."""
    y0, n0 = list(x_t), list(n_t)
    for ext in self.extensions:
      y0, n0 = ext.start_weights(y0, n0, client_state)
    return list(y0), list(n0)

  def init(self, x_t, broadcast_value, client_state=(), n_t=()):
    """`n_t`: the non-trainable weights, kept in the carry when the weights are
    split (`extension.WeightsSplit`); the execution updates them (`with_non_trainable`)."""
    y0, n0 = self.start_weights(x_t, n_t, client_state)
    y0 = tuple(y0)
    carry = collections.OrderedDict(
        y=y0,
        local=tuples(self.recipe.initial_local(broadcast_value, list(y0), client_state)),
        client_state=client_state,
        n=tuple(n0) if self.split is not None else (),
        first_loss=tf.constant(0.0),
        num_examples=tf.constant(0, tf.int64),
        step=tf.constant(0, tf.int32))
    for ext in self.extensions:
      carry.update(ext.init_carry(x_t))
    return carry

  def before_steps(self, carry, passes):
    """The extensions' work before the first step (`passes`: `extension.ClientPasses`)."""
    for ext in self.extensions:
      carry = ext.before_steps(carry, passes)
    return carry

  def measure(self, passes):
    """An evaluation without training: what the extensions measure, by name."""
    measured = collections.OrderedDict()
    for ext in self.extensions:
      measured.update(ext.measure(passes))
    return measured

  def step(self, carry, grads, loss, num_examples, hparams, grad_at=None):
    """`num_examples`: of every batch the step consumes; `hparams`: the message's
    (η, K and the recipe's `client_hparams`); `grad_at(weights, j)`: the
    execution's gradient on the step's batch j (for `step_context`)."""
    grads = tuple(grads)
    is_first = tf.equal(carry['step'], 0)
    lr = hparams['learning_rate']
    context = {name: hparams[name] for name in self.recipe.client_hparams}
    for ext in self.extensions:
      context.update(ext.step_context(carry, grad_at))
    # Tuples throughout: TFF optimisers insist that weights and state have the
    # same structure.
    local, y = self.recipe.local_step(carry['local'], carry['y'], grads, lr, carry['step'],
                                      **context)
    stepped = collections.OrderedDict(carry)  # the extensions' entries pass through
    stepped.update(
        y=tuple(y), local=tuples(local),
        first_loss=tf.where(is_first, tf.cast(loss, tf.float32), carry['first_loss']),
        num_examples=carry['num_examples'] + tf.cast(num_examples, tf.int64),
        step=carry['step'] + 1)
    for ext in self.extensions:
      stepped = ext.after_step(carry, stepped,
                               extension_lib.Step(grads, is_first, self.branchless))
    return stepped

  def with_non_trainable(self, carry, non_trainable):
    """`carry` with the model's non-trainable weights after its training passes."""
    if self.split is None:
      return carry
    carry = collections.OrderedDict(carry)
    carry['n'] = tuple(non_trainable)
    return carry

  def statistics(self, carry, n_t):
    """The non-trainable weights a training pass uses: the carry's when the
    weights are split (they are kept and moved), else the round's."""
    return carry['n'] if self.split is not None else n_t

  def gradient_point(self, carry):
    """Where the step's g is taken: y, or an extension's point."""
    for ext in self.extensions:
      point = ext.gradient_point(carry)
      if point is not None:
        return tuple(point)
    return carry['y']

  def upload_gradient(self, carry):
    """What `upload` receives as its gradient: an extension's, or ()."""
    for ext in self.extensions:
      g = ext.upload_gradient(carry)
      if g is not None:
        return g
    return ()

  def _delta(self, carry, x_t, n_t):
    """(Δ flat, the values whose finiteness decides the drop)."""
    delta = [a - b for a, b in zip(x_t, carry['y'])]
    if self.split is None:
      return delta, delta
    # Δ at `delta_structure`'s positions, flattened as it flattens (tf.nest sorts the keys).
    delta = tf.nest.flatten(self.split.delta_structure(
        delta, [a - b for a, b in zip(list(n_t), carry['n'])]))
    return delta, delta + list(self.split.kept(carry))

  def final(self, carry, x_t, n_t=()) -> ClientResult:
    delta, checked = self._delta(carry, list(x_t), n_t)
    non_finite = zero_if_non_finite(checked)[1]
    delta = [tf.where(non_finite, tf.zeros_like(t), t) for t in delta]
    weight = client_weight(carry['num_examples'], non_finite, self.weighting)
    extra = (_as_float32(self.recipe.upload(carry['local'], self.upload_gradient(carry)))
             if self.recipe.upload is not None else ())
    if self.recipe.sum_extra:  # summed, not weighted: a dropped client adds zeros
      extra = tf.nest.map_structure(lambda t: tf.where(non_finite, tf.zeros_like(t), t), extra)
    outputs = collections.OrderedDict()
    for ext in self.extensions:
      outputs.update(ext.outputs(carry))
    if self.keeper is not None:
      outputs['private'] = tf.nest.map_structure(  # a dropped client keeps its state
          lambda new, old: tf.where(non_finite, old, new), self.keeper.new_state(carry),
          carry['client_state'])
    stats = collections.OrderedDict(
        first_minibatch_loss=carry['first_loss'], local_steps=carry['step'],
        num_examples=carry['num_examples'])
    if self.measure_client_drift:
      # Unit vectors only: their sum over clients gives the mean pairwise
      # cosine (accounting/drift.py), so no per-client upload is collected.
      stats['drift_delta_sum'], stats['drift_delta_n'] = drift.unit_vector(delta)
      stats['drift_model_sum'], stats['drift_model_n'] = drift.unit_vector(list(carry['y']))
    return ClientResult(delta, extra, weight, stats, outputs)

  def client_output(self, result: ClientResult):
    """What goes back to the client, never summed: its new state alone (the
    `StatefulClientsProcess` form), or OrderedDict of every output."""
    if list(result.outputs) == ['private']:
      return result.outputs['private']
    return result.outputs


def delta_structure(recipe: recipe_lib.Recipe, trainable, non_trainable):
  """The structure Δ is aggregated in: the trainable weights', or the weights
  split's (`extension.WeightsSplit.delta_structure`)."""
  split = recipe.weights_split
  if split is None:
    return trainable
  return split.delta_structure(tf.nest.flatten(trainable), tf.nest.flatten(non_trainable))


def zero_user_accuracy():
  return collections.OrderedDict(correct=tf.constant(0.0), examples=tf.constant(0, tf.int64),
                                 loss_sum=tf.constant(0.0))


def add_user_accuracy(ua, labels, logits, loss, rows):
  """`ua` plus one test batch: argmax hits on its real rows (`rows`: 1 or 0 per
  row), and the batch's mean loss times its examples."""
  labels = tf.reshape(labels, [-1])
  logits = tf.reshape(logits, [tf.shape(labels)[0], -1])
  hits = tf.cast(tf.equal(tf.argmax(logits, axis=-1), tf.cast(labels, tf.int64)), tf.float32)
  n = tf.reduce_sum(rows)
  return collections.OrderedDict(
      correct=ua['correct'] + tf.reduce_sum(hits * rows),
      examples=ua['examples'] + tf.cast(n, tf.int64),
      loss_sum=ua['loss_sum'] + tf.cast(loss, tf.float32) * n)


def client_sums(result: ClientResult, local_metrics, *, fused_mean: bool, delta_structure,
                summed_extra: bool = False):
  """Everything one client adds to the round's single `federated_sum`.

  Each per-client intrinsic is a call in TFF's executor, so the counters
  (steps, examples, first loss, clients; Σ steps² for the equal-K check), the
  model's unfinalized metrics and, when the mean is fused, w·Δ, w·extra and w
  travel in one structure. Returns (sums, delta) where delta is Δ packed as
  `delta_structure` (for a composed aggregator).
  """
  steps = tf.cast(result.stats['local_steps'], tf.int64)
  sums = collections.OrderedDict(
      metrics=local_metrics,
      first_minibatch_loss=result.stats['first_minibatch_loss'],
      num_examples=result.stats['num_examples'], local_steps=steps,
      local_steps_squared=steps * steps, clients=tf.constant(1, tf.int64))
  for key in DRIFT_KEYS:
    if key in result.stats:
      sums[key] = result.stats[key]
  delta = tf.nest.pack_sequence_as(delta_structure, result.delta)
  if fused_mean:
    weight = result.weight
    sums['weighted_delta'] = tf.nest.map_structure(lambda t: t * weight, delta)
    # (a recipe's summed extra upload travels unweighted: `Recipe.sum_extra`)
    sums['weighted_extra'] = (result.extra if summed_extra else
                              tf.nest.map_structure(lambda t: t * weight, result.extra))
    sums['weight'] = weight
  return sums, delta


def _as_float32(structure):
  return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), structure)
