"""TFF's own simulation tasks, with the source papers' model variants.

The task suite of "Adaptive Federated Optimization" (Reddi et al., ICLR 2021;
the FedOpt paper, section 5 and its Appendix C), built with `tff.simulation.baselines`
on the federated datasets of `tff.simulation.datasets`, with TFF's own
preprocessing:

| task                  | data (file in --data_dir)  | models (`--<task>_model`)              |
|-----------------------|----------------------------|----------------------------------------|
| cifar100_image        | cifar100.sqlite            | resnet18 (GroupNorm, 24x24 crops),     |
|                       |                            | fedgbo_cnn (FedGBO paper, 32x32)       |
| emnist_character      | emnist_all.sqlite          | cnn_dropout (Reddi), cnn, 2nn,         |
|                       |                            | fedgbo_cnn (FedGBO paper's FEMNIST CNN)|
| emnist_autoencoder    | emnist_all.sqlite          | TFF's bottleneck autoencoder           |
| shakespeare_character | shakespeare.sqlite         | lstm (TFF), gru128 (FedGBO paper),     |
|                       |                            | gru256 (decaying-K paper)              |
| stackoverflow_word    | stackoverflow.sqlite + the | TFF's LSTM 670 (10k vocabulary)        |
|                       | word counts                |                                        |
| stackoverflow_tag     | stackoverflow.sqlite + the | logistic regression 10k -> 500 tags,   |
|                       | word and tag counts        | Recall@5                               |

Data are never loaded whole: TFF's `SqlClientData` reads one client's
examples per query when that client is sampled, and the Stack Overflow
evaluation reads only the 10,000 test examples Reddi et al. validate on.

Model variants reuse the TFF task's datasets and preprocessing, except the
FedGBO paper's CIFAR-100 CNN, which takes the FedGBO paper's own preprocessing: 32x32 images
normalised per channel, random horizontal flip, then a random 32x32 crop of
the image zero-padded by 4 (docs/tasks.md and docs/algorithms.md#errata; the FedGBO code's
`RandomCrop(32, padding=4)`).

TFF's shuffle buffers are unseeded (TFF's choice), so client datasets, unlike
those of our offline tasks, differ between an interrupted and a resumed run.

A round's client datasets are built by one traced function of the client id
(`FederatedTask.trace_client_datasets`): tf.data otherwise traces TFF's
parsing and preprocessing functions anew for every client (0.1-0.7 s each,
measured on the full-size stand-ins of `bench/standins.py`).
"""

from collections.abc import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import common
from tasks import data_files
from tasks import tff_files
from tasks.models import paper_cnns
from tasks.models import recurrent

_BASELINES = tff.simulation.baselines
CIFAR100_MODELS = ('resnet18', 'fedgbo_cnn')
EMNIST_CHARACTER_MODELS = ('cnn_dropout', 'cnn', '2nn', 'fedgbo_cnn')
SHAKESPEARE_CHARACTER_MODELS = ('lstm', 'gru128', 'gru256')
RESNET_CROP = 24  # docs/tasks.md: ResNet-18 on 24x24 crops, as Reddi et al.
SHAKESPEARE_SEQUENCE_LENGTH = 80
STACKOVERFLOW_SEQUENCE_LENGTH = 20
STACKOVERFLOW_WORD_VOCAB = 10_000
STACKOVERFLOW_TAG_VOCAB = 500
# Reddi et al. validate Stack Overflow tasks on 10,000 sampled test examples.
STACKOVERFLOW_EVAL_EXAMPLES = 10_000
# TFF's default shuffle buffers (its baselines' preprocessing), used by our seeded
# shuffle before it (`base.ClientShuffle`; TFF's own is turned off by `train_spec`).
SHUFFLE_BUFFERS = {'cifar100_image': 500, 'emnist_character': 418, 'emnist_autoencoder': 418,
                   'shakespeare_character': 50, 'stackoverflow_word': 1000,
                   'stackoverflow_tag': 1000}


def train_spec(batch_size: int, num_epochs: int) -> tff.simulation.baselines.ClientSpec:
  return tff.simulation.baselines.ClientSpec(num_epochs=num_epochs, batch_size=batch_size,
                                             shuffle_buffer_size=1)


def client_shuffle(task: str, seed: int) -> base.ClientShuffle:
  return base.ClientShuffle(SHUFFLE_BUFFERS[task], seed)


def _tff_task(name: str, seed: int, **fields) -> base.FederatedTask:
  """A task on TFF's baselines: client datasets traced once, shuffled with the seed."""
  return base.FederatedTask(name=name, trace_client_datasets=True,
                            client_shuffle=client_shuffle(name, seed), **fields)


def _model_fn(keras_model_fn: Callable[[], tf.keras.Model], loss_fn, metrics_fn, input_spec):
  def model_fn():
    return tff.learning.models.from_keras_model(
        keras_model_fn(), loss=loss_fn(), input_spec=input_spec, metrics=metrics_fn())
  return model_fn


def image_preprocess(spec, image_map):
  """TFF's client pipeline for images (shuffle, epochs, cap, map, batch) around `image_map`."""
  def preprocess(dataset):
    buffer = spec.shuffle_buffer_size or 500  # TFF's CIFAR-100 default
    if buffer > 1:
      dataset = dataset.shuffle(buffer)
    if spec.num_epochs > 1:
      dataset = dataset.repeat(spec.num_epochs)
    if spec.max_elements is not None:
      dataset = dataset.take(spec.max_elements)
    return dataset.map(image_map, num_parallel_calls=tf.data.AUTOTUNE).batch(spec.batch_size)
  return preprocess


def _classification_evaluation(datasets, from_logits: bool) -> base.KerasEvaluation:
  return base.KerasEvaluation(
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
      metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
      data_fn=lambda: base.centralized_test_data(datasets))


def _sampled_test_data(datasets, num_examples: int, seed: int) -> Callable[[], tf.data.Dataset]:
  """A seeded sample of test examples, read lazily client by client."""
  def data_fn():
    raw = datasets.test_data.create_tf_dataset_from_all_clients(seed=seed)
    # Cached before preprocessing: the raw posts are small, the dense
    # bag-of-words vectors are not (10,000 x 10,000 floats).
    return datasets.eval_preprocess_fn(raw.take(num_examples).cache())
  return data_fn


def _check_model(flag: str, model: str, choices) -> None:
  if model not in choices:
    raise ValueError(f'--{flag} must be one of {", ".join(choices)}; got {model!r}')


# ---- CIFAR-100 ---------------------------------------------------------------

FEDGBO_CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
FEDGBO_CIFAR_STD = (0.2023, 0.1994, 0.2010)


def fedgbo_cifar100_preprocess_fn(spec: tff.simulation.baselines.ClientSpec, distort: bool):
  """The FedGBO paper's CIFAR-100 pipeline, in the order of TFF's preprocess functions."""
  mean = tf.constant(FEDGBO_CIFAR_MEAN)
  std = tf.constant(FEDGBO_CIFAR_STD)

  def image_map(example):
    image = (tf.cast(example['image'], tf.float32) / 255.0 - mean) / std
    if distort:
      # FedGBO flips, then crops the normalised image zero-padded by 4.
      image = tf.image.random_flip_left_right(image)
      image = tf.image.pad_to_bounding_box(image, 4, 4, 40, 40)
      image = tf.image.random_crop(image, paper_cnns.CIFAR100_INPUT_SHAPE)
    return image, example['label']

  return image_preprocess(spec, image_map)


def create_cifar100_model(model: str = 'resnet18', seed: int = 0) -> tf.keras.Model:
  """TFF's ResNet-18 with GroupNorm on 24x24 crops (softmax output), or the
  FedGBO paper's CNN on 32x32
 images (logits)."""
  _check_model('cifar100_image_model', model, CIFAR100_MODELS)
  if model == 'resnet18':
    return tff.simulation.models.resnet_models.create_resnet18(
        input_shape=(RESNET_CROP, RESNET_CROP, 3), num_classes=100)
  return paper_cnns.create_cifar100_cnn(seed=seed)


def _logits_classifier(datasets, keras_model_fn) -> tff.simulation.baselines.BaselineTask:
  """The task of a FedGBO-paper CNN: its logits under sparse cross-entropy and accuracy."""
  return tff.simulation.baselines.BaselineTask(datasets, _model_fn(
      keras_model_fn, lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      lambda: [tf.keras.metrics.SparseCategoricalAccuracy()], datasets.element_type_structure))


def create_cifar100_image(*, cifar100_image_model: str, data_dir: str, num_clients: int,
                          max_client_examples: int, batch_size: int, num_epochs: int,
                          seed: int) -> base.FederatedTask:
  model = cifar100_image_model
  _check_model('cifar100_image_model', model, CIFAR100_MODELS)
  train, test = tff_files.load_restricted('cifar100_image', 'cifar100', data_dir, num_clients,
                                         max_client_examples, seed)
  spec = train_spec(batch_size, num_epochs)
  keras_model_fn = lambda: create_cifar100_model(model, seed)
  if model == 'resnet18':
    baseline = _BASELINES.cifar100.image_classification_tasks.\
        create_image_classification_task_with_datasets(
            spec, None, 'resnet18', RESNET_CROP, RESNET_CROP, distort_train_images=True,
            train_data=train, test_data=test)
    from_logits = False  # TFF's ResNet ends in a softmax
  else:
    datasets = common.baseline_datasets(
        train, test, fedgbo_cifar100_preprocess_fn(spec, distort=True),
        fedgbo_cifar100_preprocess_fn(
            tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=64,
                                                shuffle_buffer_size=1), distort=False))
    from_logits = True
    baseline = _logits_classifier(datasets, keras_model_fn)
  return _tff_task(
      'cifar100_image', seed, baseline=baseline,
      keras_model_fn=keras_model_fn, num_classes=100,
      evaluation=_classification_evaluation(baseline.datasets, from_logits))


# ---- EMNIST ------------------------------------------------------------------


def create_emnist_character_model(model: str = 'cnn_dropout', seed: int = 0) -> tf.keras.Model:
  """TFF's EMNIST-62 models (softmax outputs) or the FedGBO paper's FEMNIST CNN (logits)."""
  _check_model('emnist_character_model', model, EMNIST_CHARACTER_MODELS)
  if model == 'fedgbo_cnn':
    return paper_cnns.create_femnist_cnn(seed=seed)
  emnist_models = _BASELINES.emnist.emnist_models
  builder = {'cnn_dropout': emnist_models.create_conv_dropout_model,
             'cnn': emnist_models.create_original_fedavg_cnn_model,
             '2nn': emnist_models.create_two_hidden_layer_model}[model]
  return builder(only_digits=False)


def create_emnist_autoencoder_model() -> tf.keras.Model:
  return _BASELINES.emnist.emnist_models.create_autoencoder_model()


def create_emnist_character(*, emnist_character_model: str, data_dir: str, num_clients: int,
                            max_client_examples: int, batch_size: int, num_epochs: int,
                            seed: int) -> base.FederatedTask:
  model = emnist_character_model
  _check_model('emnist_character_model', model, EMNIST_CHARACTER_MODELS)
  train, test = tff_files.load_restricted('emnist_character', 'emnist', data_dir, num_clients,
                                         max_client_examples, seed)
  tff_model = 'cnn_dropout' if model == 'fedgbo_cnn' else model
  char_tasks = _BASELINES.emnist.char_recognition_tasks
  baseline = char_tasks.create_character_recognition_task_from_datasets(
      train_spec(batch_size, num_epochs), None, tff_model, False, train, test)
  keras_model_fn = lambda: create_emnist_character_model(model, seed)
  if model == 'fedgbo_cnn':
    baseline = _logits_classifier(baseline.datasets, keras_model_fn)
  return _tff_task(
      'emnist_character', seed, baseline=baseline,
      keras_model_fn=keras_model_fn, num_classes=62,
      evaluation=_classification_evaluation(baseline.datasets, from_logits=model == 'fedgbo_cnn'))


def create_emnist_autoencoder(*, data_dir: str, num_clients: int, max_client_examples: int,
                              batch_size: int, num_epochs: int, seed: int) -> base.FederatedTask:
  train, test = tff_files.load_restricted('emnist_autoencoder', 'emnist', data_dir, num_clients,
                                         max_client_examples, seed)
  baseline = _BASELINES.emnist.autoencoder_tasks.create_autoencoder_task_from_datasets(
      train_spec(batch_size, num_epochs), None, train, test)
  evaluation = base.KerasEvaluation(
      loss_fn=tf.keras.losses.MeanSquaredError,
      metrics_fn=lambda: [tf.keras.metrics.MeanSquaredError(name='mean_squared_error'),
                          tf.keras.metrics.MeanAbsoluteError(name='mean_absolute_error')],
      data_fn=lambda: base.centralized_test_data(baseline.datasets))
  return _tff_task(
      'emnist_autoencoder', seed, baseline=baseline,
      keras_model_fn=create_emnist_autoencoder_model, num_classes=0,
      evaluation=evaluation)


# ---- Shakespeare -------------------------------------------------------------


def create_shakespeare_character_model(model: str = 'lstm', seed: int = 0) -> tf.keras.Model:
  """TFF's LSTM (Embedding 8, 2 x LSTM 256) or the GRU variants, over TFF's
  90-token vocabulary (86 characters, padding, OOV, BOS, EOS)."""
  _check_model('shakespeare_character_model', model, SHAKESPEARE_CHARACTER_MODELS)
  vocab_size = _BASELINES.shakespeare.VOCAB_LENGTH
  if model == 'lstm':
    return _BASELINES.shakespeare.char_prediction_models.create_recurrent_model(
        vocab_size=vocab_size, sequence_length=SHAKESPEARE_SEQUENCE_LENGTH)
  return recurrent.create_gru_sequence_model(
      vocab_size, SHAKESPEARE_SEQUENCE_LENGTH, units=128 if model == 'gru128' else 256, seed=seed)


def create_shakespeare_character(*, shakespeare_character_model: str, data_dir: str,
                                 num_clients: int, max_client_examples: int, batch_size: int,
                                 num_epochs: int, seed: int) -> base.FederatedTask:
  model = shakespeare_character_model
  _check_model('shakespeare_character_model', model, SHAKESPEARE_CHARACTER_MODELS)
  train, test = tff_files.load_restricted('shakespeare_character', 'shakespeare', data_dir, num_clients,
                                         max_client_examples, seed)
  shakespeare = _BASELINES.shakespeare
  baseline = shakespeare.char_prediction_tasks.create_character_prediction_task_from_datasets(
      train_spec(batch_size, num_epochs), None, SHAKESPEARE_SEQUENCE_LENGTH, train, test)
  vocab_size = shakespeare.VOCAB_LENGTH
  pad = shakespeare.char_prediction_preprocessing.get_special_tokens()[0]
  keras_metrics = _BASELINES.keras_metrics
  keras_model_fn = lambda: create_shakespeare_character_model(model, seed)
  if model != 'lstm':
    baseline = tff.simulation.baselines.BaselineTask(baseline.datasets, _model_fn(
        keras_model_fn, lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        lambda: [keras_metrics.NumTokensCounter(masked_tokens=[pad]),
                 keras_metrics.MaskedCategoricalAccuracy(masked_tokens=[pad])],
        baseline.datasets.element_type_structure))
  evaluation = base.KerasEvaluation(
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics_fn=lambda: [keras_metrics.MaskedCategoricalAccuracy(masked_tokens=[pad],
                                                                  name='accuracy')],
      data_fn=lambda: base.centralized_test_data(baseline.datasets))
  return _tff_task(
      'shakespeare_character', seed, baseline=baseline, keras_model_fn=keras_model_fn,
      num_classes=vocab_size, evaluation=evaluation)


# ---- Stack Overflow ----------------------------------------------------------


def create_stackoverflow_word_model(vocab_size: int = STACKOVERFLOW_WORD_VOCAB) -> tf.keras.Model:
  """TFF's next-word LSTM (Embedding 96, LSTM 670, projection 96) over the
  vocabulary plus padding, one OOV bucket, BOS and EOS."""
  so = _BASELINES.stackoverflow
  special = so.word_prediction_preprocessing.get_special_tokens(vocab_size, 1)
  return so.word_prediction_models.create_recurrent_model(
      vocab_size + special.get_number_of_special_tokens())


def create_stackoverflow_word(*, data_dir: str, num_clients: int, max_client_examples: int,
                              batch_size: int, num_epochs: int, seed: int) -> base.FederatedTask:
  data_dir = data_files.expand_dir(data_dir, tff_files.DEFAULT_CACHE_DIR)
  train, heldout, test = tff_files.load_sqlite('stackoverflow_word', 'stackoverflow', data_dir)
  vocab = tff_files.load_vocabulary('stackoverflow_word', 'word', data_dir, STACKOVERFLOW_WORD_VOCAB)
  train = tff_files.restrict_train_data(train, num_clients, max_client_examples, seed)
  so = _BASELINES.stackoverflow
  baseline = so.word_prediction_tasks.create_word_prediction_task_from_datasets(
      train_spec(batch_size, num_epochs), None, STACKOVERFLOW_SEQUENCE_LENGTH, vocab, 1, train,
      test, heldout)
  special = so.word_prediction_preprocessing.get_special_tokens(len(vocab), 1)
  extended_vocab = len(vocab) + special.get_number_of_special_tokens()
  keras_model_fn = lambda: create_stackoverflow_word_model(len(vocab))
  keras_metrics = _BASELINES.keras_metrics
  pad, oov, eos = special.padding, special.out_of_vocab, special.end_of_sentence

  def metrics_fn():  # TFF's word-prediction metrics (accuracy without pad, OOV, EOS)
    return [
        keras_metrics.MaskedCategoricalAccuracy(name='accuracy', masked_tokens=[pad]),
        keras_metrics.MaskedCategoricalAccuracy(name='accuracy_without_out_of_vocab',
                                                masked_tokens=[pad] + oov),
        keras_metrics.MaskedCategoricalAccuracy(
            name='accuracy_without_out_of_vocab_or_end_of_sentence',
            masked_tokens=[pad, eos] + oov),
    ]

  evaluation = base.KerasEvaluation(
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics_fn=metrics_fn,
      data_fn=_sampled_test_data(baseline.datasets, STACKOVERFLOW_EVAL_EXAMPLES, seed))
  return _tff_task(
      'stackoverflow_word', seed, baseline=baseline, keras_model_fn=keras_model_fn,
      num_classes=extended_vocab, evaluation=evaluation)


def create_stackoverflow_logistic_regression(word_vocab_size: int = STACKOVERFLOW_WORD_VOCAB,
                                             tag_vocab_size: int = STACKOVERFLOW_TAG_VOCAB):
  """TFF's tag-prediction model: one sigmoid unit per tag (10,000 x 500 + 500)."""
  return tf.keras.Sequential([
      tf.keras.layers.Dense(tag_vocab_size, activation='sigmoid', input_shape=(word_vocab_size,))])


def create_stackoverflow_tag(*, data_dir: str, num_clients: int, max_client_examples: int,
                             batch_size: int, num_epochs: int, seed: int) -> base.FederatedTask:
  data_dir = data_files.expand_dir(data_dir, tff_files.DEFAULT_CACHE_DIR)
  train, heldout, test = tff_files.load_sqlite('stackoverflow_tag', 'stackoverflow', data_dir)
  words = tff_files.load_vocabulary('stackoverflow_tag', 'word', data_dir, STACKOVERFLOW_WORD_VOCAB)
  tags = tff_files.load_vocabulary('stackoverflow_tag', 'tag', data_dir, STACKOVERFLOW_TAG_VOCAB)
  train = tff_files.restrict_train_data(train, num_clients, max_client_examples, seed)
  baseline = _BASELINES.stackoverflow.tag_prediction_tasks.create_tag_prediction_task_from_datasets(
      train_spec(batch_size, num_epochs), None, words, tags, train, test, heldout)
  evaluation = base.KerasEvaluation(
      loss_fn=lambda: tf.keras.losses.BinaryCrossentropy(
          from_logits=False, reduction=tf.keras.losses.Reduction.SUM),
      metrics_fn=lambda: [tf.keras.metrics.Precision(name='precision'),
                          tf.keras.metrics.Recall(top_k=5, name='recall_at_5')],
      data_fn=_sampled_test_data(baseline.datasets, STACKOVERFLOW_EVAL_EXAMPLES, seed),
      cache=False)
  return _tff_task(
      'stackoverflow_tag', seed, baseline=baseline,
      keras_model_fn=lambda: create_stackoverflow_logistic_regression(len(words), len(tags)),
      num_classes=len(tags), evaluation=evaluation)
