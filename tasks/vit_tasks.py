"""The FedAda2 paper's ViT-S/16 fine-tuning tasks: shared plumbing and CIFAR-100.

The FedAda2 paper (Appendix H.2) fine-tunes an ImageNet-21k ViT-S/16 with images
resized to 224x224 and client batch size 32, training either the new linear
head (`--finetune=head`) or the whole network after the head is replaced
(`--finetune=full`). Pretrained weights come from a local file
(`--pretrained_weights`, Google's `.npz` layout, see `tasks/models/vit.py`).
Without one, a task builds only with `--allow_random_init`, and warns: the
papers' accuracies need the pretrained backbone.

`cifar100_image` with `--cifar100_image_model=vit_s16` keeps TFF's federated
CIFAR-100 (500 clients, `cifar100.sqlite`, read as `tasks/tff_native.py`
reads it) and TFF's pipeline order (shuffle, repeat, take, map, batch), with
the FedAda2 paper's image map instead of the 24x24 crops: scale to [0, 1], bilinear
resize 32 → 224, normalise with ImageNet's mean and standard deviation. No
augmentation (the seed names none). The GLD-23K task is in `tasks/gld.py`.
"""

import os
from collections.abc import Callable

from absl import logging
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import common
from tasks import tff_files
from tasks import tff_native
from tasks.models import vit

CIFAR100_CLASSES = 100
CIFAR100_VIT_MODEL = 'vit_s16'
RANDOM_INIT_WARNING = ('%s: the ViT starts from RANDOM initialisation (--allow_random_init). Seed '
                       "002's numbers are for fine-tuning ImageNet-21k weights: pass "
                       '--pretrained_weights=<ViT-S/16 .npz> to reproduce them.')


def vit_keras_model_fn(task: str, num_classes: int, *, finetune: str, pretrained_weights: str,
                       allow_random_init: bool, seed: int,
                       config: vit.ViTConfig = vit.VIT_S16) -> Callable[[], tf.keras.Model]:
  """`--finetune`, `--pretrained_weights` and `--allow_random_init` → a ViT builder.

  `config` (not a flag: the tasks train ViT-S/16) lets tests use a tiny ViT.
  Raises ValueError (a one-line usage error in bin/train) when there are no
  weights and random initialisation was not allowed, or when the weights
  file is not a ViT checkpoint of this architecture.
  """
  if finetune not in vit.FINETUNE_MODES:
    raise ValueError(f'--finetune must be one of {", ".join(vit.FINETUNE_MODES)}; '
                     f'got {finetune!r}')
  if pretrained_weights:
    pretrained = vit.PretrainedWeights(os.path.expanduser(pretrained_weights), config)
  elif allow_random_init:
    logging.warning(RANDOM_INIT_WARNING, f'--task={task}')
    pretrained = None
  else:
    raise ValueError(f'--task={task} fine-tunes a pretrained ViT-S/16: pass '
                     '--pretrained_weights=<file.npz> (Google\'s ViT checkpoint layout, e.g. the '
                     'ImageNet-21k AugReg ViT-S/16), or --allow_random_init to train from random '
                     'initialisation (not what the FedAda2 paper measures)')
  return lambda: vit.create_vit(num_classes, config, finetune=finetune, seed=seed,
                                pretrained=pretrained)


def vit_model_fn(keras_model_fn: Callable[[], tf.keras.Model], input_spec):
  """TFF model of a logits ViT: sparse cross-entropy and accuracy."""
  def model_fn():
    return tff.learning.models.from_keras_model(
        keras_model_fn(), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=input_spec, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
  return model_fn


def logits_evaluation(datasets) -> base.KerasEvaluation:
  return base.KerasEvaluation(
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
      data_fn=lambda: base.centralized_test_data(datasets))


def cifar100_vit_preprocess_fn(spec: tff.simulation.baselines.ClientSpec, image_size: int):
  """The FedAda2 paper's CIFAR-100 images (224x224, ImageNet-normalised), TFF's pipeline order."""
  mean = tf.constant(vit.IMAGENET_MEAN)
  std = tf.constant(vit.IMAGENET_STD)

  def image_map(example):
    image = tf.cast(example['image'], tf.float32) / 255.0
    image = tf.image.resize(image, [image_size, image_size])
    return (image - mean) / std, example['label']

  return tff_native.image_preprocess(spec, image_map)


def create_cifar100_vit(*, finetune: str, pretrained_weights: str, allow_random_init: bool,
                        data_dir: str, num_clients: int, max_client_examples: int,
                        batch_size: int, num_epochs: int, seed: int) -> base.FederatedTask:
  """`cifar100_image` with the ViT-S/16 (the FedAda2 paper)."""
  keras_model_fn = vit_keras_model_fn(
      'cifar100_image', CIFAR100_CLASSES, finetune=finetune,
      pretrained_weights=pretrained_weights, allow_random_init=allow_random_init, seed=seed)
  image_size = vit.VIT_S16.image_size
  train, test = tff_files.load_restricted('cifar100_image', 'cifar100', data_dir, num_clients,
                                         max_client_examples, seed)
  spec = tff_native.train_spec(batch_size, num_epochs)  # shuffled by `client_shuffle`
  eval_spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=64,
                                                  shuffle_buffer_size=1)
  datasets = common.baseline_datasets(
      train, test, cifar100_vit_preprocess_fn(spec, image_size),
      cifar100_vit_preprocess_fn(eval_spec, image_size))
  baseline = tff.simulation.baselines.BaselineTask(
      datasets, vit_model_fn(keras_model_fn, datasets.element_type_structure))
  return base.FederatedTask(name='cifar100_image', baseline=baseline,
                            client_shuffle=tff_native.client_shuffle('cifar100_image', seed),
                            keras_model_fn=keras_model_fn, num_classes=CIFAR100_CLASSES,
                            evaluation=logits_evaluation(datasets))


def create_cifar100_image(*, cifar100_image_model: str, finetune: str, pretrained_weights: str,
                          allow_random_init: bool, data_dir: str, num_clients: int,
                          max_client_examples: int, batch_size: int, num_epochs: int,
                          seed: int) -> base.FederatedTask:
  """The `cifar100_image` task: the ViT variant, else TFF's task (tasks/tff_native.py)."""
  common = dict(data_dir=data_dir, num_clients=num_clients,
                max_client_examples=max_client_examples, batch_size=batch_size,
                num_epochs=num_epochs, seed=seed)
  if cifar100_image_model == CIFAR100_VIT_MODEL:
    return create_cifar100_vit(finetune=finetune, pretrained_weights=pretrained_weights,
                               allow_random_init=allow_random_init, **common)
  return tff_native.create_cifar100_image(cifar100_image_model=cifar100_image_model, **common)
