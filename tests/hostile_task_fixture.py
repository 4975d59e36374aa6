"""User tasks that misbehave, for `--task=tests.hostile_task_fixture:<function>`.

Built on `custom_task_fixture` (four clients, a softmax regression): one task
function raises, one task evaluates on test data that holds NaN.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tasks import base
from tests import custom_task_fixture


class UserBug(RuntimeError):
  pass


def raises() -> base.FederatedTask:
  raise UserBug('the user\'s task function failed')


def nan_test_data(batch_size: int, seed: int) -> base.FederatedTask:
  """Trains normally; every test example's features are NaN."""
  task = custom_task_fixture.make_task(batch_size, seed)
  evaluation = task.keras_evaluation()
  poison = lambda x, y: (x * tf.constant(np.nan, x.dtype), y)
  task.evaluation = dataclasses.replace(evaluation,
                                        data_fn=lambda: evaluation.data_fn().map(poison))
  return task
