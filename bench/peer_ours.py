"""The package's engines for bench/peer_worker.py (its own environment: TF 2.14, TFF).

  OursDefault    FedAvg as `bin/train --algorithm=fedavg` builds it with every
                 other flag at its default (`--execution=cohort`,
                 `--cohort_mode=auto`, `--cohort_jit_compile=auto`), fed as
                 bin/train feeds it: each client's K batches read once into
                 arrays (the workflow's ClientCache), the next round's padding
                 on a background thread while this one trains
                 (bench_cohort.CohortRunner with `background=True`).
  OursSequential the same with `--cohort_mode=sequential` (rows of recurrent settings)
  OursPerClient  the same with `--execution=per_client`: one TFF client
                 computation per client in TFF's C++ executor, data passed as
                 tf.data datasets.
  TffFedAvg      TFF's own `tff.learning.algorithms.build_weighted_fed_avg`
                 (client SGD, server SGD), the same datasets.

All three start from the setting's initial weights (`set_model_weights` on
the initialised state) and run in TFF's local C++ context as bin/train does.
"""

import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
import tensorflow as tf
import tensorflow_federated as tff

import bench_cohort
import peer_common
from tff_adaptive.execution import runtime
from tff_adaptive.rounds import cohort_data
from workflow.flags import config
from workflow.training import algorithm_builders


def _model_fn(data: peer_common.SettingData):
  shape, dtype, label_shape, _ = peer_common.SHAPES[data.setting.model]
  input_spec = (tf.TensorSpec((None,) + shape, dtype),
                tf.TensorSpec((None,) + label_shape, tf.int32))

  def model_fn():
    return tff.learning.models.from_keras_model(
        peer_common.build_model(data.setting.model), input_spec=input_spec,
        loss=peer_common.loss_fn(), metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
  return model_fn


def _datasets(data: peer_common.SettingData):
  s = data.setting
  return [tf.data.Dataset.from_tensor_slices((data.x[c], data.y[c])).batch(s.batch)
          for c in range(s.clients)]


def _start(process, data: peer_common.SettingData):
  state = process.initialize()
  weights = tff.learning.models.ModelWeights(trainable=list(data.weights), non_trainable=[])
  return process.set_model_weights(state, weights)


def _build(data: peer_common.SettingData, execution: str, **extra_flags):
  s = data.setting
  task = types.SimpleNamespace(name=f'peers_{s.model}', model_fn=_model_fn(data),
                               keras_model_fn=lambda: peer_common.build_model(s.model))
  flags = dict(algorithm='fedavg', client_learning_rate=s.client_lr,
               server_learning_rate=s.server_lr, local_steps=s.steps)
  if execution:
    flags['execution'] = execution
  flags.update(extra_flags)
  return algorithm_builders.built(task, config.from_flags(flags))


class _Rounds:
  """A process driven with `process.next(state, client datasets)`."""

  def __init__(self, process, data, notes: str = ''):
    self.process = process
    self.datasets = _datasets(data)
    self.state = _start(process, data)
    self.notes = notes

  def __call__(self):
    self.state = self.process.next(self.state, self.datasets).state

  def weights(self):
    return [w for w in self.process.get_model_weights(self.state).trainable]


class OursDefault:
  """bin/train's default execution of FedAvg, fed as bin/train feeds it."""

  FLAGS = {}

  def __init__(self, data: peer_common.SettingData):
    # As bin/train's --intra_op_threads=0 runs a task with a recurrent model.
    threads = algorithm_builders.intra_op_threads(config.from_flags(self.FLAGS),
                                                  recurrent=data.setting.model == 'gru')
    if not runtime.set_intra_op_threads(threads):
      raise RuntimeError('TensorFlow ran an op before the intra-op threads were set')
    runtime.use_local_cpp_context()
    built = _build(data, '', **self.FLAGS)
    self.process = built.process
    arrays = [cohort_data.client_batches(ds, data.setting.steps) for ds in _datasets(data)]
    self.runner = bench_cohort.CohortRunner(self.process, 0.0, arrays, 0.0,
                                            _start(self.process, data), background=True)
    self.notes = algorithm_builders.execution_line(built)

  def __call__(self):
    self.runner()

  def weights(self):
    return list(self.process.get_model_weights(self.runner.state).trainable)


class OursSequential(OursDefault):
  """The same with --cohort_mode=sequential: clients in sequence (recurrent models: with
  XLA per client step, `auto`'s choice for them before it vectorised them)."""

  FLAGS = {'cohort_mode': 'sequential'}


class OursPerClient(_Rounds):

  def __init__(self, data: peer_common.SettingData):
    runtime.use_local_cpp_context()
    built = _build(data, 'per_client')
    super().__init__(built.process, data, algorithm_builders.execution_line(built))


class TffFedAvg(_Rounds):

  def __init__(self, data: peer_common.SettingData):
    runtime.use_local_cpp_context()
    s = data.setting
    process = tff.learning.algorithms.build_weighted_fed_avg(
        _model_fn(data), client_optimizer_fn=tff.learning.optimizers.build_sgdm(s.client_lr),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(s.server_lr))
    super().__init__(process, data)
