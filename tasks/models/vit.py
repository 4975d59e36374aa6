"""ViT-S/16 in Keras, for the FedAda2 paper's fine-tuning experiments.

The FedAda2 paper fine-tunes a ViT-S/16 pretrained on ImageNet-21k (Dosovitskiy et al.
2021; Steiner et al.'s "AugReg" checkpoints) on CIFAR-100 and GLD-23K, images
resized to 224x224, either the new linear head only or the whole network after
the head is replaced ("full fine-tuning"). The architecture is Google's
`vision_transformer` ViT-S/16: 16x16 patches embedded by a stride-16 conv to
width 384, a learned class token and position embeddings (197 = 14² + 1
tokens), 12 pre-LayerNorm encoder blocks (6-head self-attention, MLP
384 → 1536 → 384 with GELU), a final LayerNorm, and a linear head on the class
token. Parameters: 21,665,664 in the backbone, + 385 per class: 21,704,164
with 100 classes (CIFAR-100) and 21,743,819 with 203 (GLD-23K), the FedAda2 paper's
counts. As in Google's code, LayerNorm ε = 1e-6, GELU is the tanh
approximation (Flax's `nn.gelu`), and the new head is zero-initialised (the
ViT paper's fine-tuning recipe). The model returns logits.

Pretrained weights are read from a local file (there is no model hub at run
time): an `.npz` in the layout of Google's published ViT checkpoints
(`embedding/kernel`, `cls`, `Transformer/posembed_input/pos_embedding`,
`Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/query/kernel`,
..., `Transformer/encoder_norm/scale`), e.g. the AugReg ImageNet-21k file
`S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0.npz`. Keras'
attention kernels have Flax's shapes ([384, 6, 64] and [6, 64, 384]), so the
arrays load unchanged. The checkpoint's head (and `pre_logits`, if any) are
dropped. `save_npz` writes a Keras ViT in the same layout (to convert weights
from elsewhere, or for tests).

TFF builds the model many times, in graphs (`model_fn` in every computation).
Pretrained values are therefore not embedded in those graphs as constants (87
MB each) but read by the variables' initialisers from per-variable tensor
files that `PretrainedWeights` writes once: the initial server model is the
pretrained one, with any algorithm and no change to the training loop. The
files live in a temporary directory of this process, so TFF workers on other
machines cannot read them (run ViT tasks locally).
"""

import atexit
import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Optional

from absl import logging
import numpy as np
import tensorflow as tf

layers = tf.keras.layers

FINETUNE_MODES = ('head', 'full')
LAYER_NORM_EPSILON = 1e-6
# ImageNet statistics (the FedAda2 paper's CIFAR-100 normalisation).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
  image_size: int = 224
  patch_size: int = 16
  width: int = 384
  depth: int = 12
  num_heads: int = 6
  mlp_dim: int = 1536

  @property
  def num_tokens(self) -> int:
    return (self.image_size // self.patch_size) ** 2 + 1


VIT_S16 = ViTConfig()


class ClassToken(layers.Layer):
  """Prepends a learned token (Google's `cls`, zero-initialised) to the patch sequence."""

  def build(self, input_shape):
    self.cls = self.add_weight(name='cls', shape=(1, 1, input_shape[-1]),
                               initializer='zeros', trainable=True)

  def call(self, x):
    batch = tf.shape(x)[0]
    return tf.concat([tf.tile(tf.cast(self.cls, x.dtype), [batch, 1, 1]), x], axis=1)


class AddPositionEmbedding(layers.Layer):
  """Adds learned position embeddings (Google's init: normal, stddev 0.02)."""

  def __init__(self, seed: int = 0, **kwargs):
    super().__init__(**kwargs)
    self.seed = seed

  def build(self, input_shape):
    self.pos_embedding = self.add_weight(
        name='pos_embedding', shape=(1, input_shape[1], input_shape[2]),
        initializer=tf.keras.initializers.RandomNormal(stddev=0.02, seed=self.seed),
        trainable=True)

  def call(self, x):
    return x + tf.cast(self.pos_embedding, x.dtype)

  def get_config(self):
    return {**super().get_config(), 'seed': self.seed}


def _gelu(x):
  return tf.keras.activations.gelu(x, approximate=True)


def _init(seed: int, i: int) -> tf.keras.initializers.Initializer:
  # Seeded: every `model_fn` call of a run builds the same initial weights.
  return tf.keras.initializers.GlorotUniform(seed=seed * 1000 + i)


def _block_name(i: int, part: str) -> str:
  return f'encoderblock_{i}_{part}'


def create_vit(num_classes: int, config: ViTConfig = VIT_S16, *, finetune: str = 'full',
               seed: int = 0, pretrained: Optional['PretrainedWeights'] = None) -> tf.keras.Model:
  """ViT (logits) with a new zero-initialised `num_classes` head.

  Args:
    num_classes: classes of the new head.
    config: the architecture (default ViT-S/16 at 224x224).
    finetune: 'full' trains every weight; 'head' freezes the backbone (its
      weights become non-trainable, so TFF neither trains nor uploads them).
    seed: seeds the random initialisation (of the weights not pretrained).
    pretrained: backbone values (`PretrainedWeights` of the same config).
  """
  if finetune not in FINETUNE_MODES:
    raise ValueError(f'--finetune must be one of {", ".join(FINETUNE_MODES)}; got {finetune!r}')
  if pretrained is not None and pretrained.config != config:
    raise ValueError(f'pretrained weights are for {pretrained.config}, not {config}')
  scope = pretrained.initializing() if pretrained is not None else contextlib.nullcontext()
  with scope:
    model = _build(num_classes, config, seed)
  if finetune == 'head':
    for layer in model.layers:
      layer.trainable = layer.name == 'head'
  return model


def _build(num_classes: int, config: ViTConfig, seed: int) -> tf.keras.Model:
  if config.image_size % config.patch_size or config.width % config.num_heads:
    raise ValueError(f'inconsistent ViT config {config}')
  inputs = tf.keras.Input((config.image_size, config.image_size, 3))
  x = layers.Conv2D(config.width, config.patch_size, strides=config.patch_size,
                    padding='valid', kernel_initializer=_init(seed, 0), name='embedding')(inputs)
  x = layers.Reshape((-1, config.width))(x)
  x = ClassToken(name='cls')(x)
  x = AddPositionEmbedding(seed=seed * 1000 + 1, name='posembed_input')(x)
  for i in range(config.depth):
    y = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON,
                                  name=_block_name(i, 'LayerNorm_0'))(x)
    y = layers.MultiHeadAttention(
        config.num_heads, config.width // config.num_heads,
        kernel_initializer=_init(seed, 10 + 4 * i),
        name=_block_name(i, 'MultiHeadDotProductAttention_1'))(y, y)
    x = layers.Add()([x, y])
    y = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON,
                                  name=_block_name(i, 'LayerNorm_2'))(x)
    y = layers.Dense(config.mlp_dim, activation=_gelu, kernel_initializer=_init(seed, 11 + 4 * i),
                     name=_block_name(i, 'MlpBlock_3_Dense_0'))(y)
    y = layers.Dense(config.width, kernel_initializer=_init(seed, 12 + 4 * i),
                     name=_block_name(i, 'MlpBlock_3_Dense_1'))(y)
    x = layers.Add()([x, y])
  x = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name='encoder_norm')(x)
  x = layers.Lambda(lambda t: t[:, 0], name='class_token')(x)
  outputs = layers.Dense(num_classes, kernel_initializer='zeros', name='head')(x)
  return tf.keras.Model(inputs, outputs, name='vit')


def num_params(config: ViTConfig, num_classes: int) -> int:
  """Closed form of the parameter count (a check on the Keras model)."""
  d, p = config.width, config.patch_size
  embedding = p * p * 3 * d + d + d + config.num_tokens * d  # conv, cls, positions
  block = 4 * d + 4 * (d * d + d) + (d * config.mlp_dim + config.mlp_dim) + (
      config.mlp_dim * d + d)
  return embedding + config.depth * block + 2 * d + num_classes * (d + 1)


# ---- Google's checkpoint layout ----------------------------------------------


def google_variables(model: tf.keras.Model) -> list[tuple[str, tf.Variable]]:
  """(checkpoint key, Keras variable) for every weight, in Google's layout."""
  pairs = [('embedding/kernel', model.get_layer('embedding').kernel),
           ('embedding/bias', model.get_layer('embedding').bias),
           ('cls', model.get_layer('cls').cls),
           ('Transformer/posembed_input/pos_embedding',
            model.get_layer('posembed_input').pos_embedding)]
  depth = sum(1 for layer in model.layers if layer.name.endswith('_LayerNorm_0'))
  for i in range(depth):
    prefix = f'Transformer/encoderblock_{i}'
    for part in ('LayerNorm_0', 'LayerNorm_2'):
      norm = model.get_layer(_block_name(i, part))
      pairs += [(f'{prefix}/{part}/scale', norm.gamma), (f'{prefix}/{part}/bias', norm.beta)]
    attention = model.get_layer(_block_name(i, 'MultiHeadDotProductAttention_1'))
    # Keras' sublayers of MultiHeadAttention (its private attributes).
    # pylint: disable=protected-access
    sublayers = (('query', attention._query_dense), ('key', attention._key_dense),
                 ('value', attention._value_dense), ('out', attention._output_dense))
    # pylint: enable=protected-access
    for name, dense in sublayers:
      pairs += [(f'{prefix}/MultiHeadDotProductAttention_1/{name}/kernel', dense.kernel),
                (f'{prefix}/MultiHeadDotProductAttention_1/{name}/bias', dense.bias)]
    for j in (0, 1):
      dense = model.get_layer(_block_name(i, f'MlpBlock_3_Dense_{j}'))
      pairs += [(f'{prefix}/MlpBlock_3/Dense_{j}/kernel', dense.kernel),
                (f'{prefix}/MlpBlock_3/Dense_{j}/bias', dense.bias)]
  norm = model.get_layer('encoder_norm')
  pairs += [('Transformer/encoder_norm/scale', norm.gamma),
            ('Transformer/encoder_norm/bias', norm.beta),
            ('head/kernel', model.get_layer('head').kernel),
            ('head/bias', model.get_layer('head').bias)]
  if len(pairs) != len(model.weights):
    raise AssertionError(f'{len(pairs)} checkpoint keys for {len(model.weights)} weights')
  return pairs


def save_npz(model: tf.keras.Model, path: str) -> None:
  """Writes the model's weights as an `.npz` in Google's ViT checkpoint layout."""
  np.savez(path, **{key: v.numpy() for key, v in google_variables(model)})


def _check_path(path: str) -> None:
  if not os.path.exists(path):
    raise ValueError(f'--pretrained_weights={path!r} does not exist')
  if not path.endswith('.npz'):
    raise ValueError(f'--pretrained_weights={path!r}: expected an .npz in the layout of Google\'s '
                     'ViT checkpoints (tasks/models/vit.py explains it; save_npz converts a '
                     'Keras ViT)')


def load_npz(path: str, config: ViTConfig = VIT_S16,
             reference: Optional[tf.keras.Model] = None) -> dict[str, np.ndarray]:
  """The backbone arrays of a Google-layout checkpoint, checked against `config`.

  The head is dropped (fine-tuning replaces it), and so are `pre_logits`, if
  present. Raises ValueError naming the first missing or misshapen array.
  `reference`: a model of `config` already built (saves building one).
  """
  _check_path(path)
  if reference is None:
    with tf.device('/cpu:0'):
      reference = _build(1, config, seed=0)
  with np.load(path, allow_pickle=False) as f:
    stored = {key: f[key] for key in f.files}
  arrays = {}
  for key, variable in google_variables(reference):
    if key.startswith('head/'):
      continue
    if key not in stored:
      raise ValueError(f'--pretrained_weights={path!r} has no {key!r}: not a ViT checkpoint of '
                       f'this architecture ({config})')
    value = stored[key]
    if tuple(value.shape) != tuple(variable.shape):
      raise ValueError(f'--pretrained_weights={path!r}: {key!r} has shape {value.shape}, the '
                       f'model needs {tuple(variable.shape)} (a checkpoint of another size or '
                       f'resolution; the model is {config})')
    arrays[key] = value.astype(np.float32)
  dropped = sorted(set(stored) - set(arrays))
  if dropped:
    logging.info('ViT weights: not loaded (replaced head): %s', ', '.join(dropped))
  return arrays


class PretrainedWeights:
  """Backbone values that a ViT's variables take at initialisation.

  The arrays are written once, one serialized tensor per variable, in the
  order in which `_build` creates the (floating-point) variables; inside
  `initializing()`, the k-th such variable created reads file k (its shape is
  checked) instead of running its random initialiser. The head keeps its own
  (zero) initialiser. Keras' integer step counters of a `Model`, created in
  eager mode only, are not counted.
  """

  def __init__(self, path: str, config: ViTConfig = VIT_S16):
    self.config = config
    self.path = path
    _check_path(path)  # before building anything
    created = []

    def record(next_creator, **kwargs):
      variable = next_creator(**kwargs)
      if variable.dtype.is_floating:
        created.append(variable)
      return variable

    with tf.device('/cpu:0'), tf.variable_creator_scope(record):
      model = _build(1, config, seed=0)
    arrays = load_npz(path, config, reference=model)
    key_of = {variable.ref(): key for key, variable in google_variables(model)}
    self._directory = tempfile.mkdtemp(prefix='vit_pretrained_')
    atexit.register(shutil.rmtree, self._directory, True)
    self._files: list[tuple[Optional[str], Optional[tuple[int, ...]]]] = []
    for k, variable in enumerate(created):
      key = key_of[variable.ref()]
      if key in arrays:
        file = os.path.join(self._directory, f'{k:04d}.tensor')
        tf.io.write_file(file, tf.io.serialize_tensor(tf.constant(arrays[key])))
        self._files.append((file, tuple(variable.shape)))
      else:
        self._files.append((None, None))  # the head: its size is the task's

  @contextlib.contextmanager
  def initializing(self) -> Iterator[None]:
    counter = iter(range(len(self._files) + 1))

    def creator(next_creator, **kwargs):
      if not tf.as_dtype(kwargs.get('dtype') or tf.float32).is_floating:
        return next_creator(**kwargs)
      k = next(counter)
      if k >= len(self._files):
        raise RuntimeError('a ViT built with pretrained weights created more variables than the '
                           'architecture has')
      file, shape = self._files[k]
      requested = kwargs.get('shape')
      if shape is not None and requested is not None and tuple(requested) != shape:
        raise RuntimeError(f'ViT variable {k} has shape {tuple(requested)}, pretrained {shape}')
      if file is not None:
        kwargs['initial_value'] = lambda: tf.ensure_shape(
            tf.io.parse_tensor(tf.io.read_file(file), tf.float32), shape)
      return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
      yield
