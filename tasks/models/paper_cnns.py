"""The CNNs of the FedGBO paper (Appendix B, Tables 5 and 6).

Both are conv3x3-32 - maxpool2 - conv3x3-64 - maxpool2 - FC512 - FC(classes),
ReLU after each conv and the first FC, stride 1, "valid" padding (the only
padding that gives the paper's parameter and FLOP counts).  They return logits:
the paper's softmax lives in its (PyTorch) loss, so use
`SparseCategoricalCrossentropy(from_logits=True)`.

Checks (tests/test_flops.py):
  * CIFAR100 (32x32x3 input, docs/algorithms.md#errata): 1,250,852 parameters, 5,163,072
    forward FLOPs per example; thesis Table 5.1 lists it as 40.0 Mbit.
  * FEMNIST (28x28x1 input, LEAF's image size; 62 classes, docs/algorithms.md#errata):
    870,334 parameters, 3,305,280 forward FLOPs per example.  Both reproduce
    every CIFAR100/FEMNIST cell of the FedGBO paper's FLOP Tables 4 and 10.
The decaying-K paper's FEMNIST CNN (Appendix B, Table 2) has the same layers with 62
outputs after the erratum in docs/algorithms.md#errata, but states 32x32 inputs; 28x28 is the size
that matches the FedGBO paper's counts, so this builder takes `input_shape` should a
32x32 variant be wanted.
"""

from collections.abc import Sequence

import tensorflow as tf

CIFAR100_INPUT_SHAPE = (32, 32, 3)
CIFAR100_NUM_CLASSES = 100
FEMNIST_INPUT_SHAPE = (28, 28, 1)
FEMNIST_NUM_CLASSES = 62


def _paper_cnn(input_shape: Sequence[int], num_classes: int, seed: int) -> tf.keras.Model:
  layers = tf.keras.layers
  # Seeded initialisers: identical initial weights in every process of a run.
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=seed * 16 + i)
  return tf.keras.Sequential([
      layers.InputLayer(input_shape=tuple(input_shape)),
      layers.Conv2D(32, 3, padding='valid', activation='relu', kernel_initializer=init(1)),
      layers.MaxPool2D(2),
      layers.Conv2D(64, 3, padding='valid', activation='relu', kernel_initializer=init(2)),
      layers.MaxPool2D(2),
      layers.Flatten(),
      layers.Dense(512, activation='relu', kernel_initializer=init(3)),
      layers.Dense(num_classes, kernel_initializer=init(4)),
  ])


def create_cifar100_cnn(num_classes: int = CIFAR100_NUM_CLASSES,
                        input_shape: Sequence[int] = CIFAR100_INPUT_SHAPE,
                        seed: int = 0) -> tf.keras.Model:
  """FedGBO paper Table 5: the CIFAR100 CNN (1,250,852 parameters at 32x32x3)."""
  return _paper_cnn(input_shape, num_classes, seed)


def create_femnist_cnn(num_classes: int = FEMNIST_NUM_CLASSES,
                       input_shape: Sequence[int] = FEMNIST_INPUT_SHAPE,
                       seed: int = 0) -> tf.keras.Model:
  """FedGBO paper Table 6: the FEMNIST CNN (870,334 parameters at 28x28x1)."""
  return _paper_cnn(input_shape, num_classes, seed)
