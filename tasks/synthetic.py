"""FedProx's synthetic(α, β) task (Li et al., 2020, "Federated Optimization in
Heterogeneous Networks", §5.1), with multinomial logistic regression.

Per client k: u_k ~ N(0, α), B_k ~ N(0, β), W_k ~ N(u_k, 1) (10×60),
b_k ~ N(u_k, 1), v_k ~ N(B_k, 1) (60-dim), x ~ N(v_k, Σ) with Σ_jj = j^(−1.2),
y = argmax(W_k x + b_k). α controls how different the clients' models are, β how
different their inputs are. As in FedProx's generator, α and β are standard
deviations and client sizes are lognormal(4, 2) + 50; we cap sizes at
`max_examples` (the uncapped tail reaches tens of thousands) and split each
client 80/20 into train/test.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import common

DIM = 60
NUM_CLASSES = 10


def generate(alpha: float, beta: float, num_clients: int, seed: int,
             max_examples: int = 1000) -> tuple[common.ClientArrays, common.ClientArrays]:
  """Returns (train, test) client arrays; deterministic in `seed`."""
  rng = np.random.default_rng(seed)
  sizes = np.minimum(rng.lognormal(4, 2, num_clients).astype(int) + 50, max_examples)
  u = rng.normal(0, alpha, num_clients)
  b_mean = rng.normal(0, beta, num_clients)
  cov_diag = np.arange(1, DIM + 1, dtype=np.float64) ** -1.2
  train, test = {}, {}
  for k in range(num_clients):
    w = rng.normal(u[k], 1, (DIM, NUM_CLASSES))
    b = rng.normal(u[k], 1, NUM_CLASSES)
    v = rng.normal(b_mean[k], 1, DIM)
    x = v + rng.normal(size=(sizes[k], DIM)) * np.sqrt(cov_diag)
    y = np.argmax(x @ w + b, axis=1)
    n_train = int(0.8 * sizes[k])
    cid = f'client_{k:04d}'
    train[cid] = {'x': x[:n_train].astype(np.float32), 'y': y[:n_train].astype(np.int32)}
    test[cid] = {'x': x[n_train:].astype(np.float32), 'y': y[n_train:].astype(np.int32)}
  return train, test


def build_keras_model(seed: int = 0) -> tf.keras.Model:
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(DIM,)),
      tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=tf.keras.initializers.Zeros()),
  ])


def create_task(*, alpha: float = 1.0, beta: float = 1.0, num_clients: int = 30,
                batch_size: int = 10, num_epochs: int = 1, seed: int = 0,
                max_examples: int = 1000) -> base.FederatedTask:
  train, test = generate(alpha, beta, num_clients, seed, max_examples)
  train_data = common.client_data_from_arrays(train)
  test_data = common.client_data_from_arrays(test)
  datasets = common.baseline_datasets(
      train_data, test_data, common.make_preprocess_fn(batch_size, num_epochs, seed),
      lambda ds: ds.batch(256))
  model_fn = common.keras_model_fn(build_keras_model, train_data.element_type_structure)
  return base.FederatedTask(
      name='synthetic', baseline=tff.simulation.baselines.BaselineTask(datasets, model_fn),
      keras_model_fn=build_keras_model, num_classes=NUM_CLASSES, test_client_data=test_data)
