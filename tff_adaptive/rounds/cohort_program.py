"""The cohort's shard program: Σ over a shard's clients of their round sums.

In sequence (`tf.map_fn`), and vectorised for feed-forward models (one
`tf.vectorized_map` of the whole function, pfor converting its step loop),
each client's round runs whole:

  for each client:
    carry = loop.init(x_t, broadcast[, state])                  client.ClientLoop
    carry = loop.before_steps(carry, passes)       the extensions' passes (_ProgramPasses)
    for each step with real rows:  g, loss = view.loss_and_grads(y, batch, mask)
                                   carry = loop.step(carry, g, loss, n, η)
    result = loop.final(carry, x_t)
  Σ over clients of client_sums(result)

Vectorised for recurrent models (`steps_outside`), the same functions run
with the nesting swapped: the steps are the
outer loop and each phase is one `tf.vectorized_map` over the clients,

  carries = vectorized_map(loop.init)                    (the clients' states stacked)
  carries = loop.before_steps(carries, passes)           (each pass: while step < S,
                                                          vectorized_map over the clients)
  while step < S:  carries = vectorized_map(loss_and_grads, loop.step, metrics; step s)
  sums = vectorized_map(loop.final, client_sums)

so that pfor never converts a `while_loop`. Converting the client's step loop
as a whole (pfor's `WhileV2` converter, which converts the loop body again
inside a new while loop) did not finish in 14 minutes for the Shakespeare GRU
unrolled over its 80 positions (docs/performance.md); converting one step's
body, outside any loop, is the conversion pfor does for one cohort gradient.

Either way a step without real rows (a client shorter than the shard's
longest) changes nothing of its client's carry, and the arithmetic per client
is the same, so the two executions give the same round.
"""

import collections
import functools

import tensorflow as tf

from tff_adaptive.rounds import client as client_lib
from tff_adaptive.rounds import cohort_aggregation
from tff_adaptive.rounds import extension
from tff_adaptive.rounds import functional


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
      out = self._clients_in_parallel(message, x_t, shard)
    elif self.vectorized:
      out = tf.vectorized_map(lambda client: self._one_client(message, x_t, client),
                              self._client_elems(shard), fallback_to_while_loop=True)
    else:
      out = self._clients_in_sequence(message, x_t, shard)
    sums, states = out if self.stateful else (out, None)
    sums = tf.nest.map_structure(lambda t: tf.reduce_sum(t, axis=0), sums)
    return (sums, states) if self.stateful else sums

  def lanes(self, messages, shard):
    """Σ per member of its clients' round sums: a population's client phase.

    `messages`: each member's message, stacked [P, ...]; `shard`: its leaves
    [P, C, ...], member p's C clients. Every (member, client) pair is one
    lane, started from its member's message (x_t, η, ...), so the lanes run
    as the shard program runs a cohort's clients (vectorised or in sequence)
    with the weights' lane axis [P × C] in place of the client axis.
    """
    why = self.why_no_lanes()
    if why:
      raise ValueError(why)
    size = tf.shape(shard['mask'])[:2]
    lanes = tf.nest.map_structure(
        lambda t: tf.reshape(t, tf.concat([[size[0] * size[1]], tf.shape(t)[2:]], 0)),
        self._client_elems(shard))
    lane_messages = tf.nest.map_structure(lambda t: tf.repeat(t, size[1], axis=0), messages)

    def one(elems):
      message, client = elems
      return self._one_client(message, _trainable(message), client)

    if self.vectorized:
      sums = tf.vectorized_map(one, (lane_messages, lanes), fallback_to_while_loop=True)
    else:
      sums = _in_sequence(one, (lane_messages, lanes))
    return tf.nest.map_structure(
        lambda t: tf.reduce_sum(tf.reshape(t, tf.concat([size, tf.shape(t)[1:]], 0)), axis=1),
        sums)

  def why_no_lanes(self):
    """Why `lanes` cannot run this program (None: it can)."""
    if self.stateful:
      return (f'{self.loop.recipe.name}: clients that keep state or measure user accuracy '
              'have no population form yet')
    if self.vectorized and steps_outside(self.view):
      return ("a population of recurrent models runs its lanes in sequence: "
              "CohortExecution(mode='sequential')")
    return None

  def _client_elems(self, shard):
    """A shard's per-client parts: its batches and mask, and what the recipe's
    clients take besides (their test batches, their states)."""
    return collections.OrderedDict((key, shard[key]) for key in shard)

  # The phases of one client's round, shared by both nestings.

  def _init(self, message, x_t, client_state=()):
    carry = self.loop.init(x_t, message['broadcast'], client_state, _non_trainable(message))
    return carry, self.view.zero_metrics()

  def _train_step(self, message):
    lr, n_t = message['hparams']['learning_rate'], _non_trainable(message)

    def step(state, group):
      carry, metrics = state
      batch, rows = group[0]
      statistics = self.loop.statistics(carry, n_t)
      grads, loss, data_loss, predictions, moved = self.view.train_pass(
          self.loop.gradient_point(carry), batch, rows, statistics)
      metrics = self.view.add_metrics(metrics, batch, predictions, rows, data_loss)
      n = tf.add_n([tf.reduce_sum(r) for _, r in group])
      passes = []  # `grad_at`'s forward passes, counted in the metrics after the step
      grad_at = functools.partial(self._grad_at, group, passes, statistics)
      stepped = self.loop.step(carry, grads, loss, tf.cast(n, tf.int64), lr, grad_at)
      for args in passes:
        metrics = self.view.add_metrics(metrics, *args)
      return self.loop.with_non_trainable(stepped, moved), metrics

    return step

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
    state = self._over_steps(self._train_step(message), client['batches'], client['mask'],
                             (carry, metrics), self.loop.recipe.batches_per_step)
    return self._final(message, x_t, state)

  # Vectorised with the steps outside: each phase one vectorized_map over the clients.

  def _clients_in_parallel(self, message, x_t, shard):
    for ext in self.loop.extensions:
      if ext.steps_outside_unsupported:
        raise ValueError(f'CohortExecution: {self.loop.recipe.name} '
                         f'{ext.steps_outside_unsupported}')
    batches, mask = shard['batches'], shard['mask']
    if 'client_state' in shard:
      state = _over_clients(lambda c: self._init(message, x_t, c), (shard['client_state'],))
    else:
      # The same start for every client, computed once and repeated: a
      # vectorized_map whose outputs ignore the client leaves pfor's index
      # placeholder in the graph, which XLA refuses (jit_compile='program').
      clients = tf.shape(mask)[0]
      state = tf.nest.map_structure(lambda t: tf.repeat(t[tf.newaxis], clients, axis=0),
                                    self._init(message, x_t))
    carry, metrics = state
    # The passes before the steps start at x_t: this nesting patches no client's weights.
    passes = _ProgramPasses(self, message, shard, (x_t, _non_trainable(message)),
                            clients_axis=True)
    state = (self.loop.before_steps(carry, passes), metrics)
    state = self._over_steps(self._train_step(message), batches, mask, state,
                             self.loop.recipe.batches_per_step, clients_axis=True)
    return _over_clients(lambda *s: self._final(message, x_t, s), state)

  def _over_steps(self, step_fn, batches, mask, state, per_step: int = 1, clients_axis=False):
    """state = step_fn(state, group) for each step of the padded batches, group
    being `per_step` consecutive (batch, rows) pairs (under XLA when
    `jit_compile`); a client's step with a batch without real rows (a shorter
    client, a last incomplete group) changes nothing of its state.
    `clients_axis`: batches, mask and state have a leading clients dimension,
    and each step is one `tf.vectorized_map` of step_fn over them."""
    if self.jit_compile and not clients_axis:
      step_fn = tf.function(step_fn, jit_compile=True)

    def masked(state, group):
      new = step_fn(state, group)
      active = tf.reduce_all([tf.reduce_sum(rows) > 0 for _, rows in group])
      return tf.nest.map_structure(lambda a, b: tf.where(active, a, b), new, state)

    step, axis = masked, 0
    if clients_axis:  # XLA compiles the whole cohort's step
      step = lambda state, group: _over_clients(masked, (state, group))
      step = tf.function(step, jit_compile=True) if self.jit_compile else step
      axis = 1

    def body(s, state):
      at = lambda i: lambda t: tf.gather(t, i, axis=axis)
      group = tuple((tf.nest.map_structure(at(s * per_step + j), batches),
                     at(s * per_step + j)(mask)) for j in range(per_step))
      return s + 1, _like(state, step(state, group))

    _, state = tf.while_loop(lambda s, _: s < tf.shape(mask)[axis] // per_step, body,
                             (tf.constant(0), state))
    return state


class _ProgramPasses(extension.ClientPasses):
  """`extension.ClientPasses` in the shard program: over the client's padded
  batches (`clients_axis`: every client's at once, the steps-outside nesting)."""

  def __init__(self, program: CohortProgram, message, client, start, clients_axis=False):
    self.program, self.client, self.clients_axis = program, client, clients_axis
    self.start = start
    self.learning_rate = message['hparams']['learning_rate']

  def over_batches(self, fn, carry):
    y0, n0 = tuple(self.start[0]), self.start[1]
    view = self.program.view

    def one(carry, group):
      batch, rows = group[0]
      grads, _, _, _ = view.loss_and_grads(y0, batch, rows, n0)
      return fn(carry, grads, tf.cast(tf.reduce_sum(rows), tf.int64))

    return self.program._over_steps(one, self.client['batches'], self.client['mask'], carry,
                                    clients_axis=self.clients_axis)

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


def _in_sequence(fn, elems):
  """fn(element) for each element of `elems` in turn (`tf.map_fn`), its output
  signature read from one trace of `fn`."""
  first = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), elems)
  graph = tf.function(fn).get_concrete_function(first)
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
  return tf.vectorized_map(lambda args: fn(*args), elems, fallback_to_while_loop=True)


def _like(old, new):
  """`new` with `old`'s static shapes: pfor's outputs may know less of a
  shape than the loop state it replaces, which `tf.while_loop` refuses."""
  def restore(o, n):
    n.set_shape(o.shape)
    return n

  return tf.nest.map_structure(restore, old, new)
