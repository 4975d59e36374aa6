"""The cohort's shard program: Σ over a shard's clients of their round sums.

In sequence (`tf.map_fn`), and vectorised for feed-forward models (one
`tf.vectorized_map` of the whole function, pfor converting its step loop),
each client's round runs whole:

  for each client:
    carry = loop.init(x_t, broadcast[, state])                  client.ClientLoop
    carry = loop.before_steps(carry, passes)       the extensions' passes (_ProgramPasses)
    for each step with real rows:  g, loss = view.loss_and_grads(y, batch, mask)
                                   carry = loop.step(carry, g, loss, n, h)
    result = loop.final(carry, x_t)
  Σ over clients of client_sums(result)

Vectorised for recurrent models (`steps_outside`), the same functions run
with the nesting swapped, over lanes: a lane is a client of the cohort (or a
(member, client) pair of a population, `lanes`), each with its own message.
The steps are the outer loop; each phase is one `tf.vectorized_map` over the
lanes, and each step's model pass one call for every lane:

  carries = vectorized_map(loop.init)                    (the lanes' states stacked)
  carries = loop.before_steps(carries, passes)           (each pass: the steps below)
  while step < S:  points = vectorized_map(where each lane's pass is taken)
                   passes = view.lane_train_pass(points, batches)   lanes.py: the lane
                            axis on the weights (or vectorized_map of the unrolled view)
                   carries = vectorized_map(metrics, loop.step; step s)
  sums = vectorized_map(loop.final, client_sums)

so that pfor never converts a `while_loop`. Converting the client's step loop
as a whole (pfor's `WhileV2` converter, which converts the loop body again
inside a new while loop) did not finish in 14 minutes for the Shakespeare GRU
unrolled over its 80 positions (docs/performance.md).

Either way a step without real rows (a client shorter than the shard's
longest) changes nothing of its client's carry, and the arithmetic per client
is the same, so the two executions give the same round.
"""

import collections
import functools
from typing import Callable, NamedTuple

import tensorflow as tf

from tff_adaptive.rounds import client as client_lib
from tff_adaptive.rounds import cohort_aggregation
from tff_adaptive.rounds import extension
from tff_adaptive.rounds import functional
from tff_adaptive.rounds import pfor_trace


class CohortProgram:
  """The shard program: Σ over a shard's clients of their round sums (and,
  for recipes whose clients take back an output, those outputs, stacked)."""

  def __init__(self, view: functional.FunctionalView, loop: client_lib.ClientLoop,
               vectorized: bool, trainable_structure, jit_compile: bool = False,
               aggregation=None):
    self.view = view
    self.aggregation = aggregation or cohort_aggregation.mean(loop.recipe.sum_extra)
    self.loop = loop
    self.vectorized = vectorized
    self.jit_compile = jit_compile
    self._trainable_structure = trainable_structure

  @property
  def stateful(self) -> bool:
    """Its clients take back an output (their state, what they measured)."""
    return self.loop.recipe.has_client_output

  def __call__(self, message, shard):
    x_t = _trainable(message)
    if self.vectorized and steps_outside(self.view):
      clients = tf.shape(shard['mask'])[0]
      out = self._lanes_in_parallel(
          tf.nest.map_structure(lambda t: tf.repeat(t[tf.newaxis], clients, axis=0), message),
          self._client_elems(shard))
    elif self.vectorized:
      out = pfor_trace.vectorized_map(lambda client: self._one_client(message, x_t, client),
                                      self._client_elems(shard))
    else:
      out = self._clients_in_sequence(message, x_t, shard)
    sums, states = out if self.stateful else (out, None)
    sums = tf.nest.map_structure(lambda t: tf.reduce_sum(t, axis=0), sums)
    return (sums, states) if self.stateful else sums

  def lanes(self, messages, shard):
    """Σ per member of its clients' round sums: a population's client phase
    (and, for recipes whose clients take back an output, those outputs [P, C, ...]).

    `messages`: each member's message, stacked [P, ...]; `shard`: its leaves
    [P, C, ...], member p's C clients (with their states and test batches,
    when the recipe takes them). Every (member, client) pair is one lane,
    started from its member's message (x_t, η, ...), so the lanes run as the
    shard program runs a cohort's clients (vectorised or in sequence) with the
    weights' lane axis [P × C] in place of the client axis.
    """
    size = tf.shape(shard['mask'])[:2]
    lanes = tf.nest.map_structure(
        lambda t: tf.reshape(t, tf.concat([[size[0] * size[1]], tf.shape(t)[2:]], 0)),
        self._client_elems(shard))
    lane_messages = tf.nest.map_structure(lambda t: tf.repeat(t, size[1], axis=0), messages)

    def one(elems):
      message, client = elems
      return self._one_client(message, _trainable(message), client)

    if self.vectorized and steps_outside(self.view):
      out = self._lanes_in_parallel(lane_messages, lanes)
    elif self.vectorized:
      out = pfor_trace.vectorized_map(one, (lane_messages, lanes))
    else:
      out = _in_sequence(one, (lane_messages, lanes))
    sums, outputs = out if self.stateful else (out, None)
    per_member = lambda t: tf.reshape(t, tf.concat([size, tf.shape(t)[1:]], 0))
    sums = tf.nest.map_structure(lambda t: tf.reduce_sum(per_member(t), axis=1), sums)
    return (sums, tf.nest.map_structure(per_member, outputs)) if self.stateful else sums

  def _client_elems(self, shard):
    """A shard's per-client parts: its batches and mask, and what the recipe's
    clients take besides (their test batches, their states)."""
    return collections.OrderedDict((key, shard[key]) for key in shard)

  # The phases of one client's round, shared by both nestings.

  def _init(self, message, x_t, client_state=()):
    carry = self.loop.init(x_t, message['broadcast'], client_state, _non_trainable(message))
    return carry, self.view.zero_metrics()

  def _train_step(self):
    """One local step: the pass it takes (`point`: where) and what follows it."""

    def point(state, message):
      carry, _ = state
      return self.loop.gradient_point(carry), self.loop.statistics(carry, _non_trainable(message))

    def after(state, group, message, out):
      carry, metrics = state
      grads, loss, data_loss, predictions, moved = out
      batch, rows = group[0]
      metrics = self.view.add_metrics(metrics, batch, predictions, rows, data_loss)
      n = tf.add_n([tf.reduce_sum(r) for _, r in group])
      passes = []  # `grad_at`'s forward passes, counted in the metrics after the step
      statistics = self.loop.statistics(carry, _non_trainable(message))
      grad_at = functools.partial(self._grad_at, group, passes, statistics)
      stepped = self.loop.step(carry, grads, loss, tf.cast(n, tf.int64), message['hparams'],
                               grad_at)
      for args in passes:
        metrics = self.view.add_metrics(metrics, *args)
      return self.loop.with_non_trainable(stepped, moved), metrics

    return _Step(point, after)

  def _final(self, message, x_t, state):
    carry, metrics = state
    result = self.loop.final(carry, x_t, _non_trainable(message))
    sums = self.aggregation.client_sums(result, metrics, self._trainable_structure,
                                        message.get('aggregator'))
    return (sums, self.loop.client_output(result)) if self.stateful else sums

  def _grad_at(self, group, passes, statistics, weights, j):
    """`grad_at` of the extensions' step context, from the functional view;
    records the pass."""
    batch, rows = group[j]
    grads, loss, data_loss, predictions = self.view.loss_and_grads(weights, batch, rows,
                                                                   statistics)
    passes.append((batch, predictions, rows, data_loss))
    return grads, loss

  # Each client's whole round: in sequence (map_fn), or vectorised whole.

  def _clients_in_sequence(self, message, x_t, shard):
    return _in_sequence(lambda client: self._one_client(message, x_t, client),
                        self._client_elems(shard))

  def _one_client(self, message, x_t, client):
    client_state = client.get('client_state', ())
    start = self.loop.start_weights(x_t, _non_trainable(message), client_state)
    carry, metrics = self._init(message, x_t, client_state)
    carry = self.loop.before_steps(carry, _ProgramPasses(self, message, client, start))
    state = self._over_steps(self._train_step().of_one(self.view, message), client['batches'],
                             client['mask'], (carry, metrics), self.loop.recipe.batches_per_step)
    return self._final(message, x_t, state)

  # The steps outside: each phase one vectorised map over the lanes, each step's
  # pass one call for every lane.

  def _lanes_in_parallel(self, messages, lanes):
    """Each lane's round sums; `messages` and `lanes` with a leading lane axis
    (a cohort's clients all with its one message, or a population's lanes)."""
    for ext in self.loop.extensions:
      if ext.steps_outside_unsupported:
        raise ValueError(f'CohortExecution: {self.loop.recipe.name} '
                         f'{ext.steps_outside_unsupported}')

    def init(message, client_state=()):
      return self.loop.init(_trainable(message), message['broadcast'], client_state,
                            _non_trainable(message))

    # Longest lanes first: the lanes still training at a step are then a prefix,
    # and each step runs only those (`_lanes_over_steps`). Everything per lane is
    # ordered so before its start is made from it.
    order = _longest_first(lanes['mask'])
    messages, lanes = _gathered(messages, order), _gathered(lanes, order)
    carry = _over_clients(init, (messages,) + ((lanes['client_state'],)
                                               if 'client_state' in lanes else ()))
    # Zeros for every lane, made once: pfor's outputs that ignore the lane keep
    # its index placeholder in the graph, which XLA refuses (jit_compile='program').
    metrics = tf.nest.map_structure(
        lambda t: tf.repeat(t[tf.newaxis], tf.shape(lanes['mask'])[0], axis=0),
        self.view.zero_metrics())
    # The passes before the steps start at x_t: this nesting patches no client's weights.
    passes = _ProgramPasses(self, messages, lanes,
                            (_trainable(messages), _non_trainable(messages)), clients_axis=True)
    state = (self.loop.before_steps(carry, passes), metrics)
    state = self._over_lane_steps(self._train_step(), lanes['batches'], lanes['mask'], state,
                                  messages, self.loop.recipe.batches_per_step)
    out = _over_clients(lambda m, *s: self._final(m, _trainable(m), s), (messages,) + state)
    return _gathered(out, tf.math.invert_permutation(order))

  def _over_lane_steps(self, step, batches, mask, state, context, per_step: int = 1):
    """`_over_steps` with a lane axis on batches, mask, state and `context`
    (what `step` reads besides, per lane): where each lane's pass is taken
    (vectorised), the pass of every lane at once (`_pass_of_lanes`), each
    lane's step after it (vectorised); a lane without real rows stays."""

    def lane_step(state, group, context):
      weights, statistics = _over_clients(step.point, (state, context))
      out = self._pass_of_lanes(weights, statistics, *group[0])

      def after(state, group, context, out):
        active = tf.reduce_all([tf.reduce_sum(rows) > 0 for _, rows in group])
        new = step.after(state, group, context, out)
        return tf.nest.map_structure(lambda a, b: tf.where(active, a, b), new, state)

      return _over_clients(after, (state, group, context, out))

    if self.jit_compile:
      lane_step = tf.function(lane_step, jit_compile=True, autograph=False)
    return _lanes_over_steps(lane_step, batches, mask, state, context, per_step)

  def _pass_of_lanes(self, weights, statistics, batch, rows):
    """`view.train_pass` of every lane: one call on the lane-axis model
    (`lanes.LaneModel`, recurrent models), or vectorised over the lanes."""
    if self.view.lane_model is not None:
      return self.view.lane_train_pass(weights, batch, rows)
    return _over_clients(lambda w, s, b, r: self.view.train_pass(w, b, r, s),
                         (weights, statistics, batch, rows))

  def _over_steps(self, step_fn, batches, mask, state, per_step: int = 1):
    """state = step_fn(state, group) for each step of the padded batches, group
    being `per_step` consecutive (batch, rows) pairs (under XLA when
    `jit_compile`); a client's step with a batch without real rows (a shorter
    client, a last incomplete group) changes nothing of its state."""
    if self.jit_compile:
      step_fn = tf.function(step_fn, jit_compile=True, autograph=False)

    def body(s, state):
      group = _group_at(batches, mask, s, per_step, axis=0)
      new = step_fn(state, group)
      active = tf.reduce_all([tf.reduce_sum(rows) > 0 for _, rows in group])
      return s + 1, _like(state, tf.nest.map_structure(lambda a, b: tf.where(active, a, b),
                                                       new, state))

    _, state = tf.while_loop(lambda s, _: s < tf.shape(mask)[0] // per_step, body,
                             (tf.constant(0), state))
    return state


class _Step(NamedTuple):
  """A step over a client's batches as the model pass it takes and what follows:
  `point(state, context)` → (weights, statistics) of the pass, `after(state,
  group, context, pass)` → the state after the step (`pass`: `train_pass`'s)."""
  point: Callable
  after: Callable

  def of_one(self, view, context):
    """step(state, group) of one client, its pass from the view."""
    def step(state, group):
      weights, statistics = self.point(state, context)
      return self.after(state, group, context, view.train_pass(weights, *group[0], statistics))
    return step


class _ProgramPasses(extension.ClientPasses):
  """`extension.ClientPasses` in the shard program: over the client's padded
  batches (`clients_axis`: every client's at once, the steps-outside nesting)."""

  def __init__(self, program: CohortProgram, message, client, start, clients_axis=False):
    self.program, self.client, self.clients_axis = program, client, clients_axis
    self.start = start
    self.learning_rate = message['hparams']['learning_rate']

  def over_batches(self, fn, carry):
    start = (tuple(self.start[0]), self.start[1])

    def at_start(carry, start):
      del carry
      return start

    def add(carry, group, start, out):
      del start
      return fn(carry, out[0], tf.cast(tf.reduce_sum(group[0][1]), tf.int64))

    step = _Step(at_start, add)
    batches, mask = self.client['batches'], self.client['mask']
    if self.clients_axis:
      return self.program._over_lane_steps(step, batches, mask, carry, start)
    return self.program._over_steps(step.of_one(self.program.view, start), batches, mask,
                                    carry)

  def evaluate(self, personalize=None):
    y0, n0 = self.start
    client, program = self.client, self.program
    weights = list(y0)
    if personalize is not None:
      first = ((tf.nest.map_structure(lambda t: t[0], client['batches']), client['mask'][0]),)
      weights = list(personalize(functools.partial(program._grad_at, first, [], n0)))

    def test_batch(ua, group):
      batch, rows = group[0]
      labels, logits, loss = program.view.evaluate(weights, batch, rows, n0)
      return client_lib.add_user_accuracy(ua, labels, logits, loss, rows)

    test = client['test']
    return program._over_steps(test_batch, test['batches'], test['mask'],
                               client_lib.zero_user_accuracy())


def steps_outside(view: functional.FunctionalView) -> bool:
  """Whether the vectorised program runs the step loop outside (recurrent
  models) or vectorises each client's whole round, its step loop inside (the
  others). Feed-forward models build either way in seconds, and on the digits
  MLP (50 clients x 10 steps, XLA over the program) the steps outside took
  1.03-1.11x the round of the clients outside in three interleaved runs
  (bench/cohort_nesting.py), so they keep the nesting pfor converts whole."""
  return view.has_rnn


def _longest_first(mask):
  """The lanes' order by their steps with real rows, longest first (mask [L, S, B])."""
  steps = tf.reduce_sum(tf.cast(tf.reduce_sum(mask, axis=2) > 0, tf.int32), axis=1)
  return tf.argsort(-steps, stable=True)


def _gathered(structure, order):
  return tf.nest.map_structure(lambda t: tf.gather(t, order), structure)


def _group_at(batches, mask, s, per_step: int, axis: int):
  """Step s's `per_step` consecutive (batch, rows) pairs, the steps on `axis`."""
  at = lambda i: lambda t: tf.gather(t, i, axis=axis)
  return tuple((tf.nest.map_structure(at(s * per_step + j), batches), at(s * per_step + j)(mask))
               for j in range(per_step))


def _lanes_over_steps(step_fn, batches, mask, state, context, per_step: int):
  """state = step_fn(state, group, context) for each step, every argument with a
  leading lane axis, the lanes longest first. A step runs only the lanes up to
  the last with real rows in it; a lane past its data leaves the loop's state
  and is written once to its place in the result, so a step neither computes
  nor copies the lanes that finished (at E = 1 the longest client sets the
  steps, and most lanes of a population finish long before it). A lane's real
  batches come first, as the shards pad them: the lanes training only shrink."""
  flat = tf.nest.flatten(state)
  done = [tf.TensorArray(t.dtype, size=tf.shape(mask)[0], element_shape=t.shape[1:])
          for t in flat]
  training = _training_lanes(mask, per_step)

  def leave(done, live, n):
    gone = tf.range(n, tf.shape(live[0])[0])
    return [ta.scatter(gone, t[n:]) for ta, t in zip(done, live)]

  def body(s, live, done):
    n = tf.minimum(training[s], tf.shape(live[0])[0])
    done = leave(done, live, n)
    head = lambda t: t[:n]
    group = tf.nest.map_structure(head, _group_at(batches, mask, s, per_step, axis=1))
    new = step_fn(tf.nest.pack_sequence_as(state, [head(t) for t in live]), group,
                  tf.nest.map_structure(head, context))
    return s + 1, [_shaped(t, like) for t, like in zip(tf.nest.flatten(new), live)], done

  invariants = (tf.TensorShape([]), [tf.TensorShape([None]).concatenate(t.shape[1:])
                                     for t in flat], [tf.TensorShape(None)] * len(flat))
  _, live, done = tf.while_loop(lambda s, *_: training[s] > 0, body,
                                (tf.constant(0), flat, done), shape_invariants=invariants)
  done = leave(done, live, tf.constant(0))
  return tf.nest.pack_sequence_as(state, [_shaped(ta.stack(), t) for ta, t in zip(done, flat)])


def _training_lanes(mask, per_step: int):
  """For each step of `per_step` batches (mask [L, S, B], lanes longest first),
  the lanes up to the last with real rows in all of them; then a 0 (the end)."""
  lanes, steps = tf.shape(mask)[0], tf.shape(mask)[1] // per_step
  real = tf.reduce_sum(mask[:, :steps * per_step], axis=2) > 0
  real = tf.reduce_all(tf.reshape(real, [lanes, steps, per_step]), axis=2)
  last = tf.reduce_max(tf.where(real, tf.range(1, lanes + 1)[:, tf.newaxis], 0), axis=0)
  return tf.concat([last, [0]], 0)


def _shaped(t, like):
  t.set_shape(tf.TensorShape([None]).concatenate(like.shape[1:]))
  return t


def _in_sequence(fn, elems):
  """fn(element) for each element of `elems` in turn (`tf.map_fn`), its output
  signature read from one trace of `fn`."""
  first = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), elems)
  # Unconverted, as the program (traced with autograph=False) calls it:
  # converting fn's calls for this one signature was most of a sequential build.
  graph = tf.function(fn, autograph=False).get_concrete_function(first)
  return tf.map_fn(fn, elems, fn_output_signature=tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype), graph.structured_outputs))


def _trainable(message) -> list:
  return [tf.convert_to_tensor(t) for t in tf.nest.flatten(message['model_weights'].trainable)]


def _non_trainable(message) -> list:
  return [tf.convert_to_tensor(t)
          for t in tf.nest.flatten(message['model_weights'].non_trainable)]


def _over_clients(fn, elems):
  """fn(*client's elems) for every client, vectorised (`tf.vectorized_map`);
  ops without a vectorising converter run client by client in a loop."""
  return pfor_trace.vectorized_map(lambda args: fn(*args), elems)


def _like(old, new):
  """`new` with `old`'s static shapes: pfor's outputs may know less of a
  shape than the loop state it replaces, which `tf.while_loop` refuses."""
  def restore(o, n):
    n.set_shape(o.shape)
    return n

  return tf.nest.map_structure(restore, old, new)
