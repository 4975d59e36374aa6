"""LEAF tasks (Caldas et al., 2019) as the FedGBO paper and the thesis use them.

Read from a LEAF data directory (`--data_dir`, e.g. `leaf/data/femnist/data`)
holding LEAF's JSON: the per-user train/test split files `train/*.json` and
`test/*.json` that LEAF's `preprocess.sh ... -t sample` writes, or only the
unsplit `all_data/*.json`, which we then split per user ourselves (80/20; a
random 20% of each user's samples, or for Shakespeare the last 20%).

* `sent140` (FedGBO paper Appendix B.2, thesis §5.2.1): LEAF's users with >= 10
  tweets; each tweet becomes a normalised bag-of-words over the 5,000 most
  frequent space-separated tokens of the training tweets; tweets with none of
  them are discarded. Binary sentiment, linear model (10,002 parameters). The
  papers' batch size is 8.
* `femnist` (FedGBO paper B.3, thesis §5.2.1): 28x28 images inverted to
  white-on-black as in the FedGBO paper, 62 classes; the first 3,000 writers (in file
  order, as the FedGBO code loads them) unless `--num_clients` says otherwise.
  Models: the FedGBO paper's CNN (870,334 parameters) or the thesis' DNN (209,662).
* `shakespeare_leaf` (FedGBO paper B.4, thesis §5.2.1): LEAF's 80-character
  sequences, each labelled with the next character, over the 79-character
  vocabulary of the FedGBO code (LEAF's letters without the newline); GRU
  models of the FedGBO paper/thesis (128 units, 162,887 parameters) or the decaying-K paper (256).

LEAF's JSON has to be parsed whole, file by file, so on first use each task
converts it once into TFF's SQLite client-data layout (one tf.Example per
sample) in `<data_dir>/tff_adaptive_cache/` (or `~/.cache/tff_adaptive/` if
the data directory is read-only). Training then reads it through TFF's
`SqlClientData`: one client's examples per query, when that client is
sampled, as for TFF's own datasets. The cache is keyed by the source files
(names, sizes, modification times) and the preprocessing settings.
"""

import collections
import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import common
from tasks import data_files
from tasks import leaf_json
from tasks.models import paper_cnns
from tasks.models import recurrent
from tasks.models import thesis_models

_FORMAT_VERSION = 1
SENT140_VOCAB_SIZE = 5000
SENT140_MIN_SAMPLES = 10
FEMNIST_DEFAULT_CLIENTS = 3000
# The FedGBO code's vocabulary: LEAF's ALL_LETTERS without '\n' (79 symbols).
SHAKESPEARE_VOCAB = (' !"&\'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]'
                     'abcdefghijklmnopqrstuvwxyz}')
SHAKESPEARE_SEQUENCE_LENGTH = 80
FEMNIST_MODELS = ('cnn', 'dnn')
SHAKESPEARE_LEAF_MODELS = ('gru128', 'gru256')
def _cache_root(data_dir: str) -> str:
  preferred = os.path.join(data_dir, 'tff_adaptive_cache')
  try:
    os.makedirs(preferred, exist_ok=True)
    probe = os.path.join(preferred, f'.probe{os.getpid()}')
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
    return preferred
  except OSError:
    fallback = os.path.expanduser(os.path.join('~', '.cache', 'tff_adaptive'))
    os.makedirs(fallback, exist_ok=True)
    return fallback


def _fingerprint(name: str, layout: leaf_json.Layout, settings: Mapping[str, Any]) -> str:
  digest = hashlib.sha1(json.dumps([_FORMAT_VERSION, name, dict(settings)]).encode())
  for path in layout.sources:
    stat = os.stat(path)
    digest.update(f'{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}'.encode())
  return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class _Converter:
  """How one LEAF dataset becomes TFF-layout examples."""
  name: str
  leaf_name: str
  parse_spec: Mapping[str, Any]
  # (task, layout) -> settings shared by all users (e.g. a vocabulary).
  prepare: Callable[[str, leaf_json.Layout], Mapping[str, Any]]
  # (samples, settings) -> (train examples, test examples), or None to drop the user.
  encode: Callable[[leaf_json.UserSamples, Mapping[str, Any]],
                   Optional[tuple[list[bytes], list[bytes]]]]
  split_last: bool = False


def _convert(task: str, converter: _Converter, data_dir: str) -> tuple[str, Mapping[str, Any]]:
  """Returns the path of the cached SQLite file (building it if needed) and its metadata."""
  layout = leaf_json.find_layout(task, converter.leaf_name, data_dir)
  fingerprint = _fingerprint(converter.name, layout, {
      'sent140_vocab_size': SENT140_VOCAB_SIZE, 'sent140_min_samples': SENT140_MIN_SAMPLES,
      'shakespeare_vocab': SHAKESPEARE_VOCAB})
  root = _cache_root(data_dir)
  path = os.path.join(root, f'{converter.name}-{fingerprint}.sqlite')
  meta_path = path[:-len('.sqlite')] + '.json'
  if os.path.exists(path) and os.path.exists(meta_path):
    with open(meta_path) as f:
      return path, json.load(f)
  print(f'Converting LEAF {converter.leaf_name} JSON from {data_dir} into {path} (once).',
        file=sys.stderr)
  settings = converter.prepare(task, layout)
  kept = []

  def clients():
    for path, user, samples in leaf_json.iter_users(task, layout, converter.split_last):
      try:
        encoded = converter.encode(samples, settings)
      except (ValueError, TypeError, KeyError, IndexError, OverflowError) as e:
        raise leaf_json.DataFileError(f'--task={task}: {path}: user {user!r}: '
                            f'{str(e).splitlines()[0] if str(e) else type(e).__name__}') from None
      if encoded is None:
        continue
      # The ordinal prefix makes TFF's alphabetical client order the file order.
      client_id = f'{len(kept):05d}_{user}'
      kept.append(client_id)
      yield 'train', client_id, encoded[0]
      yield 'test', client_id, encoded[1]

  counts = data_files.write_sql_client_data(path, clients())
  # Keys starting with '_' are working state (lookup tables), not metadata.
  meta = dict({k: v for k, v in settings.items() if not k.startswith('_')},
              num_clients=len(kept), num_examples=counts,
              sources=[os.path.relpath(p, data_dir) for p in layout.sources])
  # Per process, as the SQLite file's: two runs started together (bin/sweep,
  # the report runners' pools) convert at once, and a shared temporary name
  # was renamed away under the slower one.
  tmp_meta = f'{meta_path}.tmp{os.getpid()}'
  with open(tmp_meta, 'w') as f:
    json.dump(meta, f)
  os.replace(tmp_meta, meta_path)
  return path, meta


# ---- Per-dataset conversion ---------------------------------------------------


def _no_settings(task: str, layout: leaf_json.Layout) -> Mapping[str, Any]:
  del task, layout
  return {}


def _tweet_text(sample) -> str:
  # LEAF's Sent140 samples are [id, date, query, user, text].
  return sample[4] if isinstance(sample, (list, tuple)) else str(sample)


def _sent140_vocabulary(task: str, layout: leaf_json.Layout) -> Mapping[str, Any]:
  """The 5,000 most frequent tokens of the kept users' training tweets."""
  counts = collections.Counter()
  for _, _, (train_x, train_y, _, test_y) in leaf_json.iter_users(task, layout, split_last=False):
    if len(train_y) + len(test_y) < SENT140_MIN_SAMPLES:
      continue
    for sample in train_x:
      counts.update(_tweet_text(sample).split(' '))
  # Counter.most_common keeps first-seen order among ties, as the FedGBO code's
  # stable sort does.
  vocab = [word for word, _ in counts.most_common(SENT140_VOCAB_SIZE)]
  return {'vocab': vocab, '_index': {w: i for i, w in enumerate(vocab)}}


def _encode_sent140(samples: leaf_json.UserSamples, settings: Mapping[str, Any]):
  train_x, train_y, test_x, test_y = samples
  if len(train_y) + len(test_y) < SENT140_MIN_SAMPLES:
    return None
  index = settings['_index']
  splits = []
  for xs, ys in ((train_x, train_y), (test_x, test_y)):
    examples = []
    for sample, label in zip(xs, ys):
      tokens = [index[w] for w in _tweet_text(sample).split(' ') if w in index]
      if tokens:  # the FedGBO paper discards tweets without any vocabulary token
        examples.append(data_files.serialize_example({'tokens': tokens,
                                                       'label': _label(label, 2)}))
    splits.append(examples)
  return None if not splits[0] else (splits[0], splits[1])


def _encode_femnist(samples: leaf_json.UserSamples, settings: Mapping[str, Any]):
  del settings
  train_x, train_y, test_x, test_y = samples
  if not train_y:
    return None
  return tuple([data_files.serialize_example(
      {'pixels': _femnist_pixels(x), 'label': _label(y, FEMNIST_CLASSES)}) for x, y in zip(xs, ys)]
               for xs, ys in ((train_x, train_y), (test_x, test_y)))


FEMNIST_CLASSES = 62


def _femnist_pixels(x) -> np.ndarray:
  pixels = np.asarray(x, np.float32)
  if pixels.size != 28 * 28:
    raise ValueError(f'FEMNIST images have 784 pixels (28 x 28); got one of shape {pixels.shape}')
  if not np.all(np.isfinite(pixels)):
    raise ValueError('FEMNIST pixels must be finite numbers')
  return pixels.reshape(-1)


def _label(y, num_classes: int) -> int:
  if isinstance(y, bool) or not isinstance(y, (int, float)) or y != int(y) or not (
      0 <= y < num_classes):
    raise ValueError(f'labels must be integers in [0, {num_classes - 1}]; got {y!r}')
  return int(y)


_CHAR_INDEX = {c: i for i, c in enumerate(SHAKESPEARE_VOCAB)}
_SPACE = _CHAR_INDEX[' ']


def _encode_shakespeare(samples: leaf_json.UserSamples, settings: Mapping[str, Any]):
  del settings
  train_x, train_y, test_x, test_y = samples
  if not train_y:
    return None
  splits = []
  for xs, ys in ((train_x, train_y), (test_x, test_y)):
    examples = []
    for x, y in zip(xs, ys):
      if not isinstance(x, str) or not isinstance(y, str) or len(y) != 1:
        raise ValueError(f'LEAF Shakespeare samples are a {SHAKESPEARE_SEQUENCE_LENGTH}-character '
                         f'string and one next character; got {x!r:.40} and {y!r:.20}')
      if len(x) != SHAKESPEARE_SEQUENCE_LENGTH:
        raise ValueError(f'LEAF Shakespeare sequences have {SHAKESPEARE_SEQUENCE_LENGTH} '
                         f'characters; got {len(x)}: {x!r}')
      # Characters outside the vocabulary (LEAF maps newlines away; anything
      # else is a stray symbol) are read as spaces.
      chars = [_CHAR_INDEX.get(c, _SPACE) for c in x]
      examples.append(data_files.serialize_example({'x': chars, 'y': _CHAR_INDEX.get(y, _SPACE)}))
    splits.append(examples)
  return splits[0], splits[1]


CONVERTERS = {
    'sent140': _Converter(
        'sent140', 'sent140',
        {'tokens': tf.io.VarLenFeature(tf.int64), 'label': tf.io.FixedLenFeature([], tf.int64)},
        _sent140_vocabulary, _encode_sent140),
    'femnist': _Converter(
        'femnist', 'femnist',
        {'pixels': tf.io.FixedLenFeature([784], tf.float32),
         'label': tf.io.FixedLenFeature([], tf.int64)},
        _no_settings, _encode_femnist),
    'shakespeare_leaf': _Converter(
        'shakespeare_leaf', 'shakespeare',
        {'x': tf.io.FixedLenFeature([SHAKESPEARE_SEQUENCE_LENGTH], tf.int64),
         'y': tf.io.FixedLenFeature([], tf.int64)},
        _no_settings, _encode_shakespeare, split_last=True),
}


# ---- Client data and tasks ----------------------------------------------------


def load_client_data(task: str, data_dir: str, num_clients: int = 0,
                     default_clients: int = 0):
  """(train, test, metadata): parsed per-client data of the first N users.

  Args:
    task: one of `CONVERTERS`.
    data_dir: the LEAF data directory.
    num_clients: how many users (in file order); 0 means `default_clients`,
      or all users if that is 0 or more than there are.
    default_clients: the papers' number of users for this dataset.
  """
  if not data_dir:
    raise data_files.DataNotFoundError(
        f'--task={task} reads LEAF data: set --data_dir to the LEAF data directory '
        f'(leaf/data/{CONVERTERS[task].leaf_name}/data, with train/ and test/)')
  converter = CONVERTERS[task]
  path, meta = _convert(task, converter, os.path.expanduser(data_dir))
  parse_spec = converter.parse_spec

  def parse(dataset):
    def parse_one(proto):
      parsed = tf.io.parse_single_example(proto, parse_spec)
      return collections.OrderedDict(
          (k, tf.sparse.to_dense(v) if isinstance(v, tf.sparse.SparseTensor) else v)
          for k, v in sorted(parsed.items()))
    return dataset.map(parse_one)

  sql_train = tff.simulation.datasets.SqlClientData(path, 'train')
  sql_test = tff.simulation.datasets.SqlClientData(path, 'test')
  ids = sql_train.client_ids
  if num_clients < 0:
    raise ValueError('--num_clients must be non-negative')
  if num_clients > len(ids):
    raise ValueError(f'--num_clients={num_clients} but {data_dir} has only {len(ids)} '
                     f'{task} users')
  wanted = num_clients or min(default_clients or len(ids), len(ids))
  chosen = ids[:wanted]
  train = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      chosen, lambda cid: parse(sql_train.serializable_dataset_fn(cid)))
  test = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      chosen, lambda cid: parse(sql_test.serializable_dataset_fn(cid)))
  return train, test, meta


def _preprocess_fn(to_xy: Callable, batch_size: int, num_epochs: int, seed: int,
                   shuffle_buffer: int = 1000):
  """Shuffle (seeded, as our offline tasks) -> repeat -> map to {x, y} -> batch."""
  def preprocess(dataset):
    if shuffle_buffer > 1:
      dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return dataset.repeat(num_epochs).map(to_xy).batch(batch_size)
  return preprocess


def _femnist_xy(example):
  # The FedGBO paper: inverted so that strokes are bright on a dark background.
  x = tf.reshape(1.0 - example['pixels'], (28, 28, 1))
  return collections.OrderedDict(x=x, y=tf.cast(example['label'], tf.int32))


def _sent140_xy(example):
  tokens = example['tokens']
  bag = tf.reduce_sum(tf.one_hot(tokens, SENT140_VOCAB_SIZE), axis=0)
  x = bag / tf.cast(tf.size(tokens), tf.float32)
  return collections.OrderedDict(x=x, y=tf.cast(example['label'], tf.int32))


def _shakespeare_xy(example):
  return collections.OrderedDict(x=tf.cast(example['x'], tf.int32),
                                 y=tf.cast(example['y'], tf.int32))


def _build(task: str, to_xy: Callable, keras_model_fn, num_classes: int, *, data_dir: str,
           num_clients: int, batch_size: int, num_epochs: int, seed: int,
           default_clients: int = 0, shuffle_buffer: int = 1000,
           evaluation_fn: Optional[Callable] = None) -> base.FederatedTask:
  train, test, _ = load_client_data(task, data_dir, num_clients, default_clients)
  datasets = common.baseline_datasets(
      train, test, _preprocess_fn(to_xy, batch_size, num_epochs, seed, shuffle_buffer),
      lambda ds: ds.map(to_xy).batch(256))
  model_fn = common.classifier_model_fn(keras_model_fn, datasets.element_type_structure)
  return base.FederatedTask(
      name=task, baseline=tff.simulation.baselines.BaselineTask(datasets, model_fn),
      keras_model_fn=keras_model_fn, num_classes=num_classes,
      test_client_data=test.preprocess(lambda ds: ds.map(to_xy)),
      evaluation=evaluation_fn(test) if evaluation_fn else None)


def _sent140_evaluation(test) -> base.KerasEvaluation:
  def data_fn():
    # Cache token ids, not the dense 5,000-float bags (95k test tweets).
    tokens = base.all_clients(test).cache()
    return tokens.map(_sent140_xy).batch(256).map(lambda b: (b['x'], b['y']))
  return base.KerasEvaluation(
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
      data_fn=data_fn, cache=False)


def create_sent140(*, data_dir: str, num_clients: int, batch_size: int, num_epochs: int,
                   seed: int) -> base.FederatedTask:
  return _build('sent140', _sent140_xy,
                lambda: thesis_models.create_sent140_linear(SENT140_VOCAB_SIZE, 2, seed), 2,
                data_dir=data_dir, num_clients=num_clients, batch_size=batch_size,
                num_epochs=num_epochs, seed=seed, evaluation_fn=_sent140_evaluation)


def create_femnist(*, femnist_model: str, data_dir: str, num_clients: int, batch_size: int,
                   num_epochs: int, seed: int) -> base.FederatedTask:
  model = femnist_model
  if model not in FEMNIST_MODELS:
    raise ValueError(f'--femnist_model must be one of {", ".join(FEMNIST_MODELS)}; got {model!r}')
  if model == 'cnn':
    keras_model_fn = lambda: paper_cnns.create_femnist_cnn(seed=seed)
  else:
    keras_model_fn = lambda: thesis_models.create_femnist_dnn(seed=seed)
  return _build('femnist', _femnist_xy, keras_model_fn, 62, data_dir=data_dir,
                num_clients=num_clients, batch_size=batch_size, num_epochs=num_epochs, seed=seed,
                default_clients=FEMNIST_DEFAULT_CLIENTS)


def create_shakespeare_leaf(*, shakespeare_leaf_model: str, data_dir: str, num_clients: int,
                            batch_size: int, num_epochs: int, seed: int) -> base.FederatedTask:
  model = shakespeare_leaf_model
  if model not in SHAKESPEARE_LEAF_MODELS:
    raise ValueError(f'--shakespeare_leaf_model must be one of '
                     f'{", ".join(SHAKESPEARE_LEAF_MODELS)}; got {model!r}')
  units = 128 if model == 'gru128' else 256
  return _build('shakespeare_leaf', _shakespeare_xy,
                lambda: recurrent.create_gru_char_model(len(SHAKESPEARE_VOCAB),
                                                        SHAKESPEARE_SEQUENCE_LENGTH, units, seed),
                len(SHAKESPEARE_VOCAB), data_dir=data_dir, num_clients=num_clients,
                batch_size=batch_size, num_epochs=num_epochs, seed=seed, shuffle_buffer=10_000)
