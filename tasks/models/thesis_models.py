"""Models of the thesis chapters 3-5, as its published code builds them.

Chapter 3 (CE-FedAvg, section 3.3.1; the authors' TensorFlow code):
  * MNIST-2NN: FC200-ReLU, FC200-ReLU, FC10 (199,210 parameters).
  * MNIST-CNN: conv5x5·32 ('same') - ReLU - maxpool2, conv5x5·64 ('same') -
    ReLU - maxpool2, FC512-ReLU, FC10 (1,663,370 parameters; McMahan et al.'s
    CNN).
  * CIFAR-CNN: conv3x3·32 - BN - conv3x3·32 - BN - dropout 0.2, conv3x3·64 -
    BN - conv3x3·64 - BN - dropout 0.3, conv3x3·128 - BN - conv3x3·128 - BN -
    dropout 0.4, FC10; 'same' padding, ReLU in each conv, no pooling. The text
    also mentions L2 regularisation, which the published code does not use;
    neither do we.
Chapter 4 (MTFL, the authors' PyTorch code): the batch-norm layers are the
private "patches", so its models carry BN:
  * MNIST 2NN with BN: FC200-ReLU-BN, FC200-ReLU, FC10.
  * CIFAR10 CNN: conv3x3·32 ('valid') - ReLU - maxpool2 - BN, conv3x3·64 -
    ReLU - maxpool2 - BN, FC512-ReLU, FC10.
Chapter 5 (decaying K):
  * FEMNIST DNN: flattened 28x28 input, FC200-ReLU, FC200-ReLU, FC62
    (209,662 parameters).
  * Sent140 linear: 5,000 bag-of-words features -> 2 (10,002 parameters).

All return logits; the papers' softmax lives in their losses.
"""

import tensorflow as tf

layers = tf.keras.layers


def _init(seed: int, i: int) -> tf.keras.initializers.Initializer:
  # Seeded initialisers: identical initial weights in every process of a run.
  return tf.keras.initializers.GlorotUniform(seed=seed * 16 + i)


def _dense_stack(input_shape, hidden: list[int], num_classes: int, seed: int,
                 bn_after_first: bool = False) -> tf.keras.Model:
  body = [layers.InputLayer(input_shape=input_shape), layers.Flatten()]
  for i, units in enumerate(hidden):
    body.append(layers.Dense(units, activation='relu', kernel_initializer=_init(seed, i)))
    if bn_after_first and i == 0:
      body.append(layers.BatchNormalization())
  body.append(layers.Dense(num_classes, kernel_initializer=_init(seed, 9)))
  return tf.keras.Sequential(body)


def create_mnist_2nn(num_classes: int = 10, seed: int = 0) -> tf.keras.Model:
  return _dense_stack((28, 28, 1), [200, 200], num_classes, seed)


def create_mnist_mtfl_2nn(num_classes: int = 10, seed: int = 0) -> tf.keras.Model:
  return _dense_stack((28, 28, 1), [200, 200], num_classes, seed, bn_after_first=True)


def create_mnist_cnn(num_classes: int = 10, seed: int = 0) -> tf.keras.Model:
  return tf.keras.Sequential([
      layers.InputLayer(input_shape=(28, 28, 1)),
      layers.Conv2D(32, 5, padding='same', activation='relu', kernel_initializer=_init(seed, 1)),
      layers.MaxPool2D(2),
      layers.Conv2D(64, 5, padding='same', activation='relu', kernel_initializer=_init(seed, 2)),
      layers.MaxPool2D(2),
      layers.Flatten(),
      layers.Dense(512, activation='relu', kernel_initializer=_init(seed, 3)),
      layers.Dense(num_classes, kernel_initializer=_init(seed, 4)),
  ])


def create_cifar10_cnn(num_classes: int = 10, seed: int = 0) -> tf.keras.Model:
  body = [layers.InputLayer(input_shape=(32, 32, 3))]
  for block, (filters, dropout) in enumerate(((32, 0.2), (64, 0.3), (128, 0.4))):
    for j in range(2):
      body += [layers.Conv2D(filters, 3, padding='same', activation='relu',
                             kernel_initializer=_init(seed, 2 * block + j)),
               layers.BatchNormalization()]
    body.append(layers.Dropout(dropout, seed=seed * 16 + block))
  body += [layers.Flatten(), layers.Dense(num_classes, kernel_initializer=_init(seed, 9))]
  return tf.keras.Sequential(body)


def create_cifar10_mtfl_cnn(num_classes: int = 10, seed: int = 0) -> tf.keras.Model:
  return tf.keras.Sequential([
      layers.InputLayer(input_shape=(32, 32, 3)),
      layers.Conv2D(32, 3, activation='relu', kernel_initializer=_init(seed, 1)),
      layers.MaxPool2D(2),
      layers.BatchNormalization(),
      layers.Conv2D(64, 3, activation='relu', kernel_initializer=_init(seed, 2)),
      layers.MaxPool2D(2),
      layers.BatchNormalization(),
      layers.Flatten(),
      layers.Dense(512, activation='relu', kernel_initializer=_init(seed, 3)),
      layers.Dense(num_classes, kernel_initializer=_init(seed, 4)),
  ])


def create_femnist_dnn(num_classes: int = 62, seed: int = 0) -> tf.keras.Model:
  return _dense_stack((28, 28, 1), [200, 200], num_classes, seed)


def create_sent140_linear(vocab_size: int = 5000, num_classes: int = 2,
                          seed: int = 0) -> tf.keras.Model:
  return tf.keras.Sequential([
      layers.InputLayer(input_shape=(vocab_size,)),
      layers.Dense(num_classes, kernel_initializer=_init(seed, 1)),
  ])
