"""A user task whose training data holds NaN and inf, for `--task=tests.nan_task_fixture:nan_train_data`.

Built on `custom_task_fixture` (four clients 'user_0'..'user_3', a softmax
regression): only 'user_2' is poisoned, in its first example's features.
"""

import collections

import numpy as np
import tensorflow_federated as tff

from tasks import base
from tests import custom_task_fixture

POISONED_CLIENT = 'user_2'


def nan_train_data(batch_size: int, seed: int) -> base.FederatedTask:
  task = custom_task_fixture.make_task(batch_size, seed)
  clients = task.train_data
  data = collections.OrderedDict()
  for cid in clients.client_ids:
    x, y = (np.concatenate(column) for column in zip(*(
        (e['x'][None], e['y'][None]) for e in clients.create_tf_dataset_for_client(cid)
        .as_numpy_iterator())))
    if cid == POISONED_CLIENT:
      x[0] = [np.nan, np.inf]
    data[cid] = collections.OrderedDict(x=x, y=y)
  datasets = task.baseline.datasets
  poisoned = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=tff.simulation.datasets.TestClientData(data), test_data=datasets.test_data,
      validation_data=datasets.validation_data,
      train_preprocess_fn=datasets.train_preprocess_fn,
      eval_preprocess_fn=datasets.eval_preprocess_fn)
  return base.FederatedTask(
      name=task.name, baseline=tff.simulation.baselines.BaselineTask(poisoned, task.model_fn),
      keras_model_fn=task.keras_model_fn, num_classes=task.num_classes)
