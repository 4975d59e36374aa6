"""One client's round as three pure functions (FedJAX's client_init/step/final).

  carry  = loop.init(x_t, broadcast(s_t)[, c_i])    y_0 = x_t, local = init_local(…)
  carry  = loop.anchor(carry, ∇f(x_t; b), n_b)     `Recipe.full_gradient` only: each batch
                                                   at x_t, before training (Σ_b n_b g_b)
  carry  = loop.step(carry, g_k, loss_k, n_k, η)   one step: the recipe's local_step, g_k at
                                                   loop.gradient_point(carry) (y) on its
                                                   (first) batch; `grad_at` for more
                                                   gradients (`Recipe.gradient_fn`)
  result = loop.final(carry, x_t)                  Δ_i = x_t − y_K, extra_i, weight_i[, c_i⁺]
  output = loop.client_output(result)              what goes back to the client: its new
                                                   state[, its user accuracy]
  sums   = client_sums(result, metrics, …)         what is summed over clients

Executions differ only in how they get g_k: the per-client TFF computation
reads it from the model's variables, the cohort program from a functional
view of the model (`functional.py`), over many clients at once. Nothing of an
algorithm is written here: `recipe.init_local`, `local_step` and `upload` are.
"""

import collections
from typing import Any, NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.accounting import drift
from tff_adaptive.rounds import recipe as recipe_lib

DRIFT_KEYS = ('drift_delta_sum', 'drift_delta_n', 'drift_model_sum', 'drift_model_n')


class ClientResult(NamedTuple):
  delta: list          # Δ_i (zeroed when non-finite)
  extra: Any           # the recipe's extra upload, float32
  weight: tf.Tensor    # the client's aggregation weight (0 when Δ_i is non-finite)
  stats: Any           # OrderedDict of counters (first_minibatch_loss, local_steps, ...)
  client_state: Any = ()  # the client's new state (recipes whose clients keep one)
  user_accuracy: Any = ()  # `Recipe.user_accuracy`: its counts, measured before training


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
  """The recipe's client side, as functions of tensors only."""

  def __init__(self, recipe: recipe_lib.Recipe, weighting: tff.learning.ClientWeighting,
               measure_client_drift: bool = False, branchless: bool = False):
    self.recipe = recipe
    self.weighting = weighting
    self.measure_client_drift = measure_client_drift
    # Under tf.vectorized_map a per-client tf.cond becomes a DynamicStitch,
    # which XLA cannot compile (MimeXlite's first gradient under
    # jit_compile='program'): the cohort's vectorised program selects instead.
    self.branchless = branchless

  def start_weights(self, x_t, n_t=(), client_state=()):
    """(y_0, n_0): x_t and the non-trainable weights with the client's private
    weights patched in (`Recipe.private_trainable`, `private_non_trainable`)."""
    y0, n0 = list(x_t), list(n_t)
    if self.recipe.has_private_weights:
      private = client_state['weights']
      for i, value in zip(self.recipe.private_trainable, private['trainable']):
        y0[i] = value
      for i, value in zip(self.recipe.private_non_trainable, private['non_trainable']):
        n0[i] = value
    return y0, n0

  def init(self, x_t, broadcast_value, client_state=(), n_t=()):
    """`n_t`: the non-trainable weights, for recipes that split the weights
    (`Recipe.splits_weights`); the execution updates them (`with_non_trainable`)."""
    y0, n0 = self.start_weights(x_t, n_t, client_state)
    y0 = tuple(y0)
    carry = collections.OrderedDict(
        y=y0,
        local=tuples(self.recipe.initial_local(broadcast_value, list(y0),
                                               self.recipe.own_state(client_state))),
        client_state=client_state,
        n=tuple(n0) if self.recipe.splits_weights else (),
        g0=tuple(tf.zeros_like(v) for v in x_t) if self.recipe.uses_first_gradient else (),
        first_loss=tf.constant(0.0),
        num_examples=tf.constant(0, tf.int64),
        step=tf.constant(0, tf.int32))
    if self.recipe.full_gradient:
      carry['full_sum'] = tuple(tf.zeros_like(v) for v in x_t)
      carry['full_examples'] = tf.constant(0, tf.int64)
    return carry

  def anchor(self, carry, grads, num_examples):
    """One batch of the pass at x_t (`Recipe.full_gradient`), before any `step`.

    Sums n_b·g_b and n_b in the order of TFF's Mime Lite client (g_sum + g·n),
    so that the mean `final` hands `upload` is bit-identical to TFF's.
    """
    n = tf.cast(num_examples, tf.int64)
    carry = collections.OrderedDict(carry)
    carry['full_sum'] = tuple(s + g * tf.cast(n, g.dtype)
                              for s, g in zip(carry['full_sum'], grads))
    carry['full_examples'] = carry['full_examples'] + n
    return carry

  def step(self, carry, grads, loss, num_examples, lr, grad_at=None):
    """`num_examples`: of every batch the step consumes; `grad_at(weights, j)`:
    the execution's gradient on the step's batch j (`Recipe.gradient_fn`)."""
    grads = tuple(grads)
    is_first = tf.equal(carry['step'], 0)
    g0 = carry['g0']
    if self.recipe.uses_first_gradient and self.branchless:
      g0 = tuple(tf.where(is_first, g, old) for g, old in zip(grads, g0))
    elif self.recipe.uses_first_gradient:
      # A cond, not tf.where: no copy of the model-sized gradient per step.
      g0 = tf.cond(is_first, lambda: grads, lambda: g0)
    # Tuples throughout: TFF optimisers insist that weights and state have the
    # same structure.
    context = {'grad_at': grad_at} if self.recipe.gradient_fn else {}
    local, y = self.recipe.local_step(carry['local'], carry['y'], grads, lr, carry['step'],
                                      **context)
    stepped = collections.OrderedDict(carry)  # the full-gradient sums pass through
    stepped.update(
        y=tuple(y), local=tuples(local), g0=g0,
        first_loss=tf.where(is_first, tf.cast(loss, tf.float32), carry['first_loss']),
        num_examples=carry['num_examples'] + tf.cast(num_examples, tf.int64),
        step=carry['step'] + 1)
    return stepped

  def with_non_trainable(self, carry, non_trainable):
    """`carry` with the model's non-trainable weights after its training passes."""
    if not self.recipe.splits_weights:
      return carry
    carry = collections.OrderedDict(carry)
    carry['n'] = tuple(non_trainable)
    return carry

  def gradient_point(self, carry):
    """Where the step's g is taken: y, or `Recipe.gradient_at`'s point."""
    if self.recipe.gradient_at is None:
      return carry['y']
    return tuple(self.recipe.gradient_at(carry['local'], list(carry['y'])))

  def first_gradient(self, carry):
    """What `upload` receives as g_0: the first step's gradient, or with
    `Recipe.full_gradient` the example-weighted mean of the pass at x_t."""
    if not self.recipe.full_gradient:
      return carry['g0']
    n = carry['full_examples']
    return tuple(tf.math.divide_no_nan(s, tf.cast(n, s.dtype)) for s in carry['full_sum'])

  def _delta(self, carry, x_t, n_t):
    """(Δ flat, the values whose finiteness decides the drop): Δ of the shared
    weights, and with private weights also their new values."""
    recipe = self.recipe
    if not recipe.splits_weights:
      delta = [a - b for a, b in zip(x_t, carry['y'])]
      return delta, delta
    # Δ at `delta_structure`'s positions, flattened as it flattens (tf.nest sorts the keys).
    delta = tf.nest.flatten(delta_structure(
        recipe, [a - b for a, b in zip(x_t, carry['y'])],
        [a - b for a, b in zip(list(n_t), carry['n'])]))
    kept = ([carry['y'][i] for i in recipe.private_trainable] +
            [carry['n'][i] for i in recipe.private_non_trainable])
    return delta, delta + kept

  def _new_client_state(self, carry):
    own = (self.recipe.client_state_update(carry['local'])
           if self.recipe.init_client_state is not None else ())
    if not self.recipe.has_private_weights:
      return own
    return self.recipe.private_state(carry['y'], carry['n'], own)

  def final(self, carry, x_t, n_t=()) -> ClientResult:
    delta, checked = self._delta(carry, list(x_t), n_t)
    non_finite = zero_if_non_finite(checked)[1]
    delta = [tf.where(non_finite, tf.zeros_like(t), t) for t in delta]
    weight = client_weight(carry['num_examples'], non_finite, self.weighting)
    extra = (_as_float32(self.recipe.upload(carry['local'], self.first_gradient(carry)))
             if self.recipe.upload is not None else ())
    if self.recipe.sum_extra:  # summed, not weighted: a dropped client adds zeros
      extra = tf.nest.map_structure(lambda t: tf.where(non_finite, tf.zeros_like(t), t), extra)
    client_state = ()
    if self.recipe.has_client_state:
      client_state = tf.nest.map_structure(  # a dropped client keeps its state
          lambda new, old: tf.where(non_finite, old, new), self._new_client_state(carry),
          carry['client_state'])
    stats = collections.OrderedDict(
        first_minibatch_loss=carry['first_loss'], local_steps=carry['step'],
        num_examples=carry['num_examples'])
    if self.measure_client_drift:
      # Unit vectors only: their sum over clients gives the mean pairwise
      # cosine (accounting/drift.py), so no per-client upload is collected.
      stats['drift_delta_sum'], stats['drift_delta_n'] = drift.unit_vector(delta)
      stats['drift_model_sum'], stats['drift_model_n'] = drift.unit_vector(list(carry['y']))
    return ClientResult(delta, extra, weight, stats, client_state)

  def personalized_weights(self, x_t, lr, grad_at):
    """What user accuracy measures: `Recipe.personalize`'s weights (`grad_at` on
    the client's first training batch), or x_t."""
    if self.recipe.personalize is None:
      return list(x_t)
    return list(self.recipe.personalize(list(x_t), lr, grad_at))

  def client_output(self, result: ClientResult):
    """What goes back to the client, never summed: its new state, or with
    `Recipe.user_accuracy` OrderedDict(ua=counts[, private=new state])."""
    if not self.recipe.user_accuracy:
      return result.client_state
    output = collections.OrderedDict(ua=result.user_accuracy)
    if self.recipe.has_client_state:
      output['private'] = result.client_state
    return output


def delta_structure(recipe: recipe_lib.Recipe, trainable, non_trainable):
  """The structure Δ is aggregated in: the trainable weights', or for recipes
  that split the weights OrderedDict(trainable=shared, non_trainable=averaged shared)."""
  if not recipe.splits_weights:
    return trainable
  t, n = tf.nest.flatten(trainable), tf.nest.flatten(non_trainable)
  averaged = (recipe_lib.shared(recipe.private_non_trainable, len(n))
              if recipe.average_non_trainable else [])
  return collections.OrderedDict(
      trainable=tuple(t[i] for i in recipe_lib.shared(recipe.private_trainable, len(t))),
      non_trainable=tuple(n[i] for i in averaged))


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
