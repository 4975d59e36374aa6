"""A `from_keras_model` VariableModel as pure functions of its weights.

The cohort execution trains many clients in one program (vectorised with
`tf.vectorized_map`, or in sequence), so it cannot keep a client's weights in
variables. `FunctionalView` recomputes what the model's `forward_pass` computes
from tensors: the Keras model is cloned with its variables replaced by the
client's weights (the trick of TFF's `functional_model_from_keras`, which
itself refuses to run outside graph mode), the loss is the model's loss on the
real examples of a padded batch, and the metrics' unfinalized values are
those `report_local_unfinalized_metrics` would hold.

Padded batches: a batch of B rows with n real ones (mask 1) gives the same
loss and gradient as the n rows alone, because the model's Keras loss reduces
SUM_OVER_BATCH_SIZE: loss(y, ŷ, sample_weight=mask) · B / n. Batch
normalisation (not fused: on inputs other than images) computes its batch
statistics over the real rows (frequency weights), and its moving statistics,
the model's non-trainable weights, are inputs and outputs of a training pass
(`train_pass`), as the variables of a per-client model hold them. Other
reductions, several losses, other non-trainable weights, fused batch norm
(whose moving variance differs), subclassed models (no `clone_model`) and
metrics other than Keras ones are not supported: `Unsupported` says which, and
the round runs per client.
"""

import collections

import numpy as np

import tensorflow as tf
# TFF 0.87's tensor-backed variable, the same one TFF's functional metrics use
# (tff.learning.metrics.create_functional_metric_fns), which drops sample weights.
from tensorflow_federated.python.core.environments.tensorflow_frontend import variable_utils

from tff_adaptive.rounds import lanes
from tff_adaptive.rounds import recurrent


class Unsupported(ValueError):
  """The model has no functional view; the message says why."""


_TFF_COUNTERS = {'NumExamplesCounter': 'num_examples', 'NumBatchesCounter': 'num_batches'}
_REDUCTIONS = (tf.keras.losses.Reduction.AUTO, tf.keras.losses.Reduction.SUM_OVER_BATCH_SIZE)


def _keras_parts(model):
  keras_model = getattr(model, '_keras_model', None)
  loss_fns = getattr(model, '_loss_fns', None)
  if not isinstance(keras_model, tf.keras.Model) or loss_fns is None:
    raise Unsupported('the model does not come from tff.learning.models.from_keras_model')
  if len(loss_fns) != 1:
    raise Unsupported('the model has several losses')
  if getattr(loss_fns[0], 'reduction', None) not in _REDUCTIONS:
    raise Unsupported('the loss does not reduce SUM_OVER_BATCH_SIZE')
  _check_non_trainable(keras_model, model.non_trainable_variables)
  if isinstance(keras_model, tf.keras.Sequential) or getattr(keras_model, '_is_graph_network',
                                                             False):
    return keras_model, loss_fns[0]
  raise Unsupported('the Keras model is subclassed (tf.keras.models.clone_model cannot clone it)')


def _check_non_trainable(keras_model, non_trainable) -> None:
  """Non-trainable weights only as the moving statistics of batch norm that the
  view computes as Keras does (not fused, no renormalisation or ghost batches)."""
  if not non_trainable:
    return
  statistics = []
  for layer in keras_model.submodules:
    if isinstance(layer, tf.keras.layers.BatchNormalization):
      if layer.fused or layer.renorm or layer.virtual_batch_size is not None:
        raise Unsupported('the model has fused batch norm (on images), renormalisation or '
                          'ghost batches')
      statistics += [layer.moving_mean, layer.moving_variance]
  if any(not any(v is s for s in statistics) for v in non_trainable):
    raise Unsupported('the model has non-trainable weights other than batch-norm statistics')


def _masked_moments(model, rows):
  """Batch norm in `model` takes its batch statistics over the real rows only:
  a padded batch normalises as its real rows alone would."""
  for layer in model.submodules:
    if isinstance(layer, tf.keras.layers.BatchNormalization):

      def moments(inputs, reduction_axes, keep_dims, mask=None):
        del mask
        weights = tf.reshape(tf.cast(rows, inputs.dtype), [-1] + [1] * (inputs.shape.rank - 1))
        return tf.nn.weighted_moments(inputs, axes=reduction_axes, frequency_weights=weights,
                                      keepdims=keep_dims)

      layer._calculate_mean_and_var = moments  # pylint: disable=protected-access


def _metric_plan(model):
  """(name, kind, constructor or None, variable (dtype, shape)s) per metric, in report order."""
  plan = []
  for metric in model.get_metrics():
    kind = _TFF_COUNTERS.get(type(metric).__name__)
    if type(metric).__name__ == '_WeightedMeanLossMetric':
      kind = 'loss'
    constructor = None
    if kind is None:
      kind = 'keras'
      config = metric.get_config()
      constructor = lambda cls=type(metric), config=config: cls.from_config(config)
    plan.append((metric.name, kind, constructor,
                 [(v.dtype, tuple(v.shape)) for v in metric.variables]))
  return plan


class FunctionalView:
  """Loss, gradients and metric sums of the model as functions of its weights."""

  def __init__(self, model_fn, generic_rnn: bool = False):
    """`generic_rnn`: run Keras GRU/LSTM layers through their generic recurrent
    loop (`_generic_rnn`); for steps compiled with XLA."""
    self._generic_rnn = generic_rnn
    with tf.Graph().as_default():
      model = model_fn()
      self._keras_model, self._loss_fn = _keras_parts(model)
      self._plan = _metric_plan(model)
      shapes = [tuple(v.shape) for v in model.trainable_variables]
      statistics = [tuple(v.shape) for v in model.non_trainable_variables]
      self.has_non_trainable = bool(statistics)
      layers = [layer for layer in self._keras_model.submodules
                if isinstance(layer, tf.keras.layers.Layer)]
      self.has_rnn = any(isinstance(layer, tf.keras.layers.RNN) for layer in layers)
      self.has_conv = any(
          isinstance(layer, (tf.keras.layers.Conv1D, tf.keras.layers.Conv2D,
                             tf.keras.layers.Conv3D)) for layer in layers)
      self.has_conv_or_rnn = self.has_rnn or self.has_conv
      # Whether clients can be vectorised with their recurrent layers unrolled
      # (recurrent.py); the cohort sets `unroll_rnn` when it does so.
      self.rnn_unrolled_cells = recurrent.unrolled_cells(self._keras_model)
      self.rnn_vectorise_reason = recurrent.why_not_vectorised(self._keras_model)
      # Recurrent models whose lanes run with the lane axis on their weights.
      self.lane_reason = lanes.why_not(self._keras_model) if self.has_rnn else 'no recurrence'
      self._unreduced_loss = _unreduced(self._loss_fn)
      if self._unreduced_loss is None:
        self.lane_reason = 'the loss has no unreduced form (from_config with reduction none)'
      self.lane_model = lanes.LaneModel(self._keras_model) if self.lane_reason is None else None
    self.unroll_rnn = False
    self._check_clone_order(shapes, statistics)

  def _check_clone_order(self, shapes, statistics):
    created = ([], [])

    def record(next_creator, **kwargs):
      variable = next_creator(**kwargs)
      created[0 if kwargs.get('trainable', True) else 1].append(tuple(variable.shape))
      return variable

    with tf.Graph().as_default(), tf.variable_creator_scope(record):
      tf.keras.models.clone_model(self._keras_model)
    if created != (shapes, statistics):
      raise Unsupported('the cloned Keras model creates its weights in another order')

  def _clone_with(self, trainable, non_trainable=(), rows=None):
    """(the model on these weights, its non-trainable weights as tensor variables,
    which a training pass moves)."""
    weights, values, statistics = list(trainable), list(non_trainable), []

    def swap(next_creator, **kwargs):
      del next_creator
      if kwargs.get('trainable', True):
        return weights.pop(0)
      statistics.append(variable_utils.TensorVariable(
          values.pop(0), dtype=kwargs.get('dtype'), name=kwargs.get('name', 'Variable')))
      return statistics[-1]

    with tf.variable_creator_scope(swap):
      model = tf.keras.models.clone_model(self._keras_model)
    if self._generic_rnn:
      _generic_rnn(model)
    if self.unroll_rnn:
      recurrent.unroll(model)
    if rows is not None and self.has_non_trainable:
      _masked_moments(model, rows)
    return model, statistics

  def loss_and_grads(self, trainable, batch, mask, non_trainable=()):
    """(gradients, training loss, data loss, predictions) on the real rows of a batch."""
    return self.train_pass(trainable, batch, mask, non_trainable)[:4]

  def train_pass(self, trainable, batch, mask, non_trainable=()):
    """`loss_and_grads` and the non-trainable weights after it (the moving
    statistics move in training mode); `non_trainable`: the model's, before it."""
    x, y = _inputs(batch)
    trainable = list(trainable)
    with tf.GradientTape() as tape:
      tape.watch(trainable)
      model, statistics = self._clone_with(trainable, non_trainable, mask)
      # TFF's forward pass calls the model in a tf.function, whose outputs lose
      # Keras masks (`_keras_mask`, e.g. Embedding(mask_zero=True) in the
      # Shakespeare models): its loss and metrics count the masked steps, and
      # so do these, to equal it.
      predictions = tf.nest.map_structure(tf.identity, model(x, training=True))
      scale = tf.math.divide_no_nan(tf.cast(tf.shape(mask)[0], tf.float32), tf.reduce_sum(mask))
      data_loss = self._loss_fn(y, predictions, sample_weight=mask) * scale
      loss = tf.add_n([data_loss] + list(model.losses))  # regularisers, as TFF adds them
    grads = tape.gradient(loss, trainable)
    grads = [tf.zeros_like(w) if g is None else tf.convert_to_tensor(g)
             for g, w in zip(grads, trainable)]
    return grads, loss, data_loss, predictions, [s.read_value() for s in statistics]

  def lane_train_pass(self, trainable, batch, mask):
    """`train_pass` of every lane at once on the lane-axis model (`lane_model`):
    each argument and result with a leading lane axis [L, ...]."""
    x, y = _inputs(batch)
    trainable = list(trainable)
    with tf.GradientTape() as tape:
      tape.watch(trainable)
      predictions = self.lane_model(trainable, x)
      data_loss = self._lane_losses(y, predictions, mask)
      # The sum's gradient wrt a lane's weights is that lane's own gradient.
      total = tf.reduce_sum(data_loss)
    grads = tape.gradient(total, trainable)
    grads = [tf.zeros_like(w) if g is None else tf.convert_to_tensor(g)
             for g, w in zip(grads, trainable)]
    return grads, data_loss, data_loss, predictions, []

  def _lane_losses(self, y, predictions, mask):
    """Each lane's loss as the model's (SUM_OVER_BATCH_SIZE) on its real rows:
    the unreduced loss's weighted sum over the lane's elements, per element,
    scaled by B / n: the lanes as one batch of L × B rows, no loop over them."""
    lanes, rows = tf.shape(mask)[0], tf.shape(mask)[1]
    flat = lambda t: tf.reshape(t, tf.concat([[lanes * rows], tf.shape(t)[2:]], 0))
    losses = self._unreduced_loss(flat(y), flat(predictions), sample_weight=flat(mask))
    losses = tf.reshape(losses, [lanes, -1])
    per_element = tf.reduce_sum(losses, axis=1) / tf.cast(tf.shape(losses)[1], tf.float32)
    return per_element * tf.math.divide_no_nan(tf.cast(rows, tf.float32),
                                               tf.reduce_sum(mask, axis=1))

  def evaluate(self, trainable, batch, mask, non_trainable=()):
    """(labels, predictions, loss) in inference mode on the real rows of a batch
    (user accuracy: what `forward_pass(batch, training=False)` gives)."""
    x, y = _inputs(batch)
    model, _ = self._clone_with(list(trainable), non_trainable)
    predictions = tf.nest.map_structure(tf.identity, model(x, training=False))
    scale = tf.math.divide_no_nan(tf.cast(tf.shape(mask)[0], tf.float32), tf.reduce_sum(mask))
    loss = tf.add_n([self._loss_fn(y, predictions, sample_weight=mask) * scale] +
                    list(model.losses))
    return y, predictions, loss

  def zero_metrics(self):
    return collections.OrderedDict(
        (name, [tf.zeros(shape, dtype) for dtype, shape in variables])
        for name, _, _, variables in self._plan)

  def add_metrics(self, state, batch, predictions, mask, data_loss):
    """`state` plus this batch, as the model's metrics would count its real rows."""
    _, y = _inputs(batch)
    n = tf.reduce_sum(mask)
    new = collections.OrderedDict()
    for name, kind, constructor, variables in self._plan:
      dtypes = [dtype for dtype, _ in variables]
      if kind == 'loss':  # a Mean of batch losses weighted by batch size
        values = [state[name][0] + data_loss * n, state[name][1] + n]
      elif kind == 'num_examples':
        values = [state[name][0] + tf.cast(n, dtypes[0])]
      elif kind == 'num_batches':
        values = [state[name][0] + tf.cast(n > 0, dtypes[0])]
      else:
        values = _update_keras_metric_masked(constructor, state[name], y, predictions, mask)
      new[name] = [tf.cast(v, d) for v, d in zip(values, dtypes)]
    return new


  def finalize(self, state):
    """The finalized metrics of summed values, eagerly (TFF's Keras finalizers
    build a metric on every trace, so they run in graphs only)."""
    if not hasattr(self, '_eager_metrics'):
      self._eager_metrics = {name: constructor() for name, kind, constructor, _ in self._plan
                             if kind == 'keras'}
    result = collections.OrderedDict()
    for name, kind, _, _ in self._plan:
      values = [np.asarray(v) for v in state[name]]
      if kind == 'loss':  # a Mean: total / count
        result[name] = np.float32(values[0] / values[1]) if values[1] else np.float32(0)
      elif kind in ('num_examples', 'num_batches'):
        result[name] = values[0]
      else:
        metric = self._eager_metrics[name]
        for variable, value in zip(metric.variables, values):
          variable.assign(value)
        result[name] = metric.result().numpy()
    return result


def _unreduced(loss_fn):
  """The same Keras loss reducing nothing (per example), or None."""
  try:
    return type(loss_fn).from_config({**loss_fn.get_config(),
                                      'reduction': tf.keras.losses.Reduction.NONE})
  except (TypeError, ValueError, NotImplementedError):
    return None


def _generic_rnn(model):
  """Keras GRU and LSTM layers (also inside wrappers such as Bidirectional) run
  their cell in `backend.rnn`'s loop, as `RNN(GRUCell)` does, instead of calling
  the `tf.function` that lets Grappler swap in cuDNN. Same arithmetic; but under
  XLA the gradient of that function call makes XLA's constant analysis require
  every input of the call (the layer's weights and the data feeding it) as a
  compile-time constant, so a jit-compiled step recompiled at every call (new
  weights, new batch): seconds per step (bench/xla_recompile_repro.py)."""
  for layer in model.submodules:
    if getattr(layer, '_could_use_gpu_kernel', False):
      layer._could_use_gpu_kernel = False  # pylint: disable=protected-access


def _inputs(batch):
  if isinstance(batch, collections.abc.Mapping):
    return batch['x'], batch['y']
  return batch[0], batch[1]


def _mask_like(mask, y):
  """The per-row mask broadcast to the label's shape ([B] → [B, T] for sequences)."""
  y = tf.nest.flatten(y)[0]
  mask = tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([tf.rank(y) - 1], tf.int32)], 0))
  return mask * tf.ones_like(y, tf.float32)


def _update_keras_metric_masked(constructor, values, y, predictions, mask):
  """The metric updated on the real rows. The row mask is first broadcast to the
  label's shape, which masked sequence metrics (TFF's Shakespeare and Stack Overflow
  ones multiply their own [B, T] mask by it) and Precision/Recall on multi-hot labels
  need; a metric that reduces the label's last axis first (mean squared error of an
  autoencoder) refuses that shape at trace time and gets the [B] row mask."""
  try:
    return _update_keras_metric(constructor, values, y, predictions, _mask_like(mask, y))
  except ValueError:
    return _update_keras_metric(constructor, values, y, predictions, mask)


def _update_keras_metric(constructor, values, y, predictions, sample_weight):
  """A Keras metric's update_state on tensors: its variables are the given values."""
  values = list(values)

  def from_values(next_creator, **kwargs):
    del next_creator
    kwargs.pop('initial_value', None)
    return variable_utils.TensorVariable(initial_value=values.pop(0), **kwargs)

  with tf.variable_creator_scope(from_values):
    metric = constructor()
  update = metric.update_state
  while hasattr(update, '__original_wrapped__'):  # see TFF's create_functional_metric_fns
    update = update.__original_wrapped__
  update(y, predictions, sample_weight=sample_weight)
  return [v.read_value() for v in metric.variables]
