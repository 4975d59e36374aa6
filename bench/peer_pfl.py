"""pfl-research's FedAvg for bench/peer_worker.py (its own environment: pfl 0.6.0, TF >= 2.16).

Built the way pfl-research's own benchmarks build it
(benchmarks/image_classification/tf/train.py in apple/pfl-research): a
compiled Keras model in `TFModel` with an SGD central optimizer,
`FederatedAveraging` on a `SimulatedBackend` over a `FederatedDataset` of
the users' arrays, `NNTrainHyperParams(local_num_epochs=1,
local_batch_size=B, local_learning_rate=...)`, no central evaluation
(`val_cohort_size=0`). The cohort is every user of the setting, in order
(the `minimize_reuse` sampler cycles through the ids), so every round trains
the same clients on the same batches as the other frameworks' rounds.

pfl runs all its central iterations in one `algorithm.run` call; a callback
stamps the end of each, so a round's seconds are from the end of the previous
one (the first round's also include `run`'s own start).
"""

import time

# pylint: disable=g-import-not-at-top
import tensorflow as tf
from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm import FederatedAveraging
from pfl.algorithm import NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNTrainHyperParams
from pfl.metrics import Metrics
from pfl.model.tensorflow import TFModel

import peer_common


class _Stamps(TrainingProcessCallback):
  """perf_counter() at the end of every central iteration."""

  def __init__(self):
    self.stamps = []

  def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
    self.stamps.append(time.perf_counter())
    return False, Metrics()


class PflFedAvg:
  """FedAvg in pfl-research's simulator on the setting's users and initial weights."""

  def __init__(self, data: peer_common.SettingData):
    s = data.setting
    self.setting = s
    keras_model = data.model()
    keras_model.compile(optimizer=tf.keras.optimizers.SGD(s.client_lr), loss=peer_common.loss_fn())
    self.model = TFModel(model=keras_model, metrics={},
                         central_optimizer=tf.keras.optimizers.SGD(s.server_lr))
    users = {c: (data.x[c], data.y[c]) for c in range(s.clients)}
    federated = FederatedDataset(lambda c: Dataset(users[c], user_id=c),
                                 get_user_sampler('minimize_reuse', list(users)))
    self.backend = SimulatedBackend(training_data=federated, val_data=federated)
    self.train_params = NNTrainHyperParams(local_num_epochs=1, local_learning_rate=s.client_lr,
                                           local_batch_size=s.batch)
    self.keras_model = keras_model
    self.notes = 'SimulatedBackend, FederatedAveraging, TFModel (tf.keras %s)' % getattr(
        tf.keras, '__version__', '?')

  def run(self, rounds: int):
    params = NNAlgorithmParams(central_num_iterations=rounds,
                               evaluation_frequency=rounds + 1,  # only iteration 0's
                               train_cohort_size=self.setting.clients, val_cohort_size=0)
    stamps = _Stamps()
    t0 = time.perf_counter()
    FederatedAveraging().run(algorithm_params=params, backend=self.backend, model=self.model,
                             model_train_params=self.train_params, callbacks=[stamps])
    ends = [t0] + stamps.stamps
    return [b - a for a, b in zip(ends[:-1], ends[1:])]

  def weights(self):
    return [v.numpy() for v in self.keras_model.trainable_variables]
