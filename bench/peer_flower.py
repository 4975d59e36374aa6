"""Flower's FedAvg for bench/peer_worker.py (its own environment: flwr[simulation] with Ray).

Flower ships the orchestration and no trainer, so the row is Flower's
Simulation Runtime (`flwr.simulation.run_simulation`, Ray backend) carrying
the raw loop's arithmetic: a `ServerApp` whose main runs
`flwr.serverapp.strategy.FedAvg` (every node in every round, no federated
evaluation), and a `ClientApp` whose train handler sets the received
weights on the setting's Keras model, runs the raw loop's client body (K SGD
steps on the client's batches in order, one `tf.function`) and replies with
its weights and example count. Node i is client i (its `partition-id`). The
setting file's path travels in the round's train config, so every Ray actor
loads the same file once and keeps the model and the traced step.

FedAvg's weighted mean of the clients' weights is the raw loop's
`g + mean(Δ)` (server learning rate 1; every client has K·B examples).
Flower's default client resources (2 CPUs) give one actor on this 2-core
machine, so clients train one after another, as in the raw loop.

A round's seconds are between the strategy's central-evaluation calls, made
before the first round and after each (it evaluates nothing); the first
round also holds the actor's start (TensorFlow's import, the step's tracing).
"""

import os
import time

import numpy as np
import tensorflow as tf
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

import peer_common

# One per actor process, keyed by the setting file: built on a node's first message.
_TRAINERS = {}


class LocalTrainer:
  """The raw loop's client body on one Keras model: any client's K steps."""

  def __init__(self, data_path: str):
    data = peer_common.SettingData(data_path)
    s = data.setting
    self.model = data.model()
    variables = self.model.trainable_variables
    fn = peer_common.loss_fn()
    shape = (s.clients, s.steps, s.batch)
    self.x = tf.constant(data.x.reshape(shape + data.x.shape[2:]))
    self.y = tf.constant(data.y.reshape(shape + data.y.shape[2:]))
    self.examples = s.steps * s.batch

    @tf.function
    def local_epoch(x, y):
      for k in tf.range(s.steps):
        with tf.GradientTape() as tape:
          loss = fn(y[k], self.model(x[k], training=True))
        for v, grad in zip(variables, tape.gradient(loss, variables)):
          v.assign_sub(s.client_lr * tf.convert_to_tensor(grad))  # Embedding: IndexedSlices

    self._epoch = local_epoch

  def train(self, client: int, weights):
    self.model.set_weights(weights)
    self._epoch(self.x[client], self.y[client])
    return self.model.get_weights()


def _train(msg: Message, context: Context) -> Message:
  path = str(msg.content['config']['data'])
  if path not in _TRAINERS:
    _TRAINERS[path] = LocalTrainer(path)
  trainer = _TRAINERS[path]
  weights = trainer.train(int(context.node_config['partition-id']),
                          msg.content['arrays'].to_numpy_ndarrays())
  content = RecordDict({'arrays': ArrayRecord(weights),
                        'metrics': MetricRecord({'num-examples': trainer.examples})})
  return Message(content=content, reply_to=msg)


def client_app() -> ClientApp:
  app = ClientApp()
  app.train()(_train)
  return app


class FlowerFedAvg:
  """FedAvg in Flower's Simulation Runtime on the setting's clients and initial weights."""

  def __init__(self, data: peer_common.SettingData):
    self.data = data
    self.path = os.path.abspath(data.path)
    self.final = None
    import flwr, ray  # pylint: disable=g-import-not-at-top,multiple-imports
    self.notes = (f'flwr.simulation.run_simulation (Ray {ray.__version__} backend), '
                  f'flwr.serverapp.strategy.FedAvg, flwr {flwr.__version__}, '
                  f"Keras {getattr(tf.keras, '__version__', 'tf_keras')}")

  def run(self, rounds: int):
    clients = self.data.setting.clients
    stamps = []

    def stamp(server_round: int, arrays: ArrayRecord):
      del server_round, arrays
      stamps.append(time.perf_counter())

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
      del context
      strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients,
                        min_available_nodes=clients)
      result = strategy.start(grid=grid, initial_arrays=ArrayRecord(self.data.weights),
                              num_rounds=rounds, train_config=ConfigRecord({'data': self.path}),
                              evaluate_fn=stamp)
      self.final = result.arrays.to_numpy_ndarrays()

    # Ray's actors import this module by name to run the ClientApp's handler.
    os.environ['PYTHONPATH'] = os.path.dirname(os.path.abspath(__file__))
    run_simulation(server_app=server, client_app=client_app(), num_supernodes=clients)
    if self.final is None or len(stamps) != rounds + 1:
      raise RuntimeError(f'the simulation ended after {max(0, len(stamps) - 1)} of {rounds} '
                         'rounds (its log above says why)')
    return [b - a for a, b in zip(stamps[:-1], stamps[1:])]

  def weights(self):
    return [np.asarray(w) for w in self.final]
