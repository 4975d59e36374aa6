"""tff_adaptive from a user's own TFF project: four algorithms, TFF aggregators, eval, a program.

Run it with the installed package, from anywhere (it needs nothing from the
tff_adaptive checkout):

  pip install -r requirements.txt && pip install --no-deps tensorflow-federated==0.87.0
  pip install /path/to/tff_adaptive        # or git+file:///path/to/tff_adaptive
  python quickstart.py [--rounds=2] [--program_dir=/tmp/quickstart_program]

What it shows (docs/library.md explains each part):
  1. the user's own Keras model and `tff.simulation.datasets.TestClientData`;
  2. FedGBO with TFF's `build_adam`, FedAdam with the paper's semantics,
     Mime Lite and FedAda2 with an SM3 client, built like TFF's builders;
  3. each composed with `tff.learning.robust_aggregator` and with
     `tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed`;
  4. the trained weights evaluated by `tff.learning.algorithms.build_fed_eval`;
  5. one algorithm under `tff.learning.programs.train_model` with a
     `tff.program.FileProgramStateManager`, stopped and resumed.
"""

import argparse
import asyncio
import collections
import sys
import tempfile

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.algorithms import fedada2
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import mimelite
from tff_adaptive.execution import runtime
from tff_adaptive.optimizers import paper_fedopt
from tff_adaptive.optimizers import sm3

NUM_CLIENTS, FEATURES, CLASSES, BATCH = 4, 8, 3, 8


# ---- 1. The user's own model and data ------------------------------------

def client_data() -> tff.simulation.datasets.ClientData:
  rng = np.random.default_rng(0)
  true_w = rng.normal(size=(FEATURES, CLASSES))
  data = collections.OrderedDict()
  for i in range(NUM_CLIENTS):
    x = rng.normal(loc=0.3 * i, size=(32, FEATURES)).astype(np.float32)
    y = np.argmax(x @ true_w, axis=1).astype(np.int32)
    data[f'client_{i}'] = collections.OrderedDict(x=x, y=y)
  return tff.simulation.datasets.TestClientData(data)


def preprocess(dataset: tf.data.Dataset) -> tf.data.Dataset:
  return dataset.map(lambda e: (e['x'], e['y'])).batch(BATCH)


def keras_model() -> tf.keras.Model:
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
      tf.keras.layers.Dense(16, activation='relu'),
      tf.keras.layers.Dense(CLASSES),
  ])


INPUT_SPEC = (tf.TensorSpec([None, FEATURES], tf.float32), tf.TensorSpec([None], tf.int32))


def model_fn() -> tff.learning.models.VariableModel:
  return tff.learning.models.from_keras_model(
      keras_model(), input_spec=INPUT_SPEC,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


# ---- 2. Four algorithms, built like TFF's builders --------------------------

def builders():
  """name → f(model_aggregator) → LearningProcess."""
  return {
      # FedGBO (the FedGBO paper): TFF's own Adam is the global biased optimiser.
      'fedgbo': lambda agg: fedgbo.build_fedgbo(
          model_fn, tff.learning.optimizers.build_adam(0.01), local_steps=3,
          model_aggregator=agg),
      # FedAdam (the FedOpt paper) with Algorithm 2's server Adam (no bias correction, τ outside √).
      'fedadam_paper': lambda agg: fedopt.build_fedopt(
          model_fn, tff.learning.optimizers.build_sgdm(0.1),
          paper_fedopt.build_paper_adam(0.01, tau=1e-3), model_aggregator=agg),
      # Mime Lite (Karimireddy et al. 2021) with a momentum base optimiser.
      'mimelite': lambda agg: mimelite.build_mimelite(
          model_fn, tff.learning.optimizers.build_sgdm(0.1, momentum=0.9),
          tff.learning.optimizers.build_sgdm(1.0), model_aggregator=agg),
      # FedAda2 (the FedAda2 paper): SM3-Adam on clients, paper Adam on the server.
      'fedada2': lambda agg: fedada2.build_fedada2(
          model_fn, sm3.build_sm3_adam(0.05), paper_fedopt.build_paper_adam(0.01),
          local_steps=3, model_aggregator=agg),
  }


# ---- 3. TFF aggregators ---------------------------------------------------------

def aggregators():
  return {
      'mean': None,  # each builder's default
      'robust': tff.learning.robust_aggregator(zeroing=True, clipping=True),
      # DP is unweighted: the builders then weight clients uniformly.
      'dp': tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
          noise_multiplier=0.1, clients_per_round=NUM_CLIENTS, clip=1.0),
  }


def train(process, data, rounds):
  state = process.initialize()
  datasets = [preprocess(data.create_tf_dataset_for_client(c)) for c in data.client_ids]
  for _ in range(rounds):
    output = process.next(state, datasets)
    state = output.state
  return state, output.metrics


# ---- 4. Federated evaluation with TFF's build_fed_eval --------------------------

def evaluate(weights, data) -> float:
  evaluation = tff.learning.algorithms.build_fed_eval(model_fn)
  eval_state = evaluation.set_model_weights(evaluation.initialize(), weights)
  datasets = [preprocess(data.create_tf_dataset_for_client(c)) for c in data.client_ids]
  metrics = evaluation.next(eval_state, datasets).metrics
  return float(metrics['client_work']['eval']['current_round_metrics']['loss'])


# ---- 5. tff.learning.programs.train_model with resume --------------------------

def run_program(process, data, program_dir: str, total_rounds: int) -> int:
  """Trains until `total_rounds` under TFF's program logic; resumes from `program_dir`."""
  # The data source is saved with the program state (TFF deep-copies it), and
  # tf.data.Datasets cannot be copied: clients are named by id and build
  # their own datasets inside the computation.
  @tff.tensorflow.computation(tf.string)
  def client_dataset(client_id):
    return preprocess(data.serializable_dataset_fn(client_id))

  by_id = tff.simulation.compose_dataset_computation_with_learning_process(
      client_dataset, process)
  state_manager = tff.program.FileProgramStateManager(program_dir)
  asyncio.run(tff.learning.programs.train_model(
      train_process=by_id,
      train_data_source=tff.program.ClientIdDataSource(data.client_ids),
      train_per_round_clients=NUM_CLIENTS, train_total_rounds=total_rounds,
      program_state_manager=state_manager,
      model_output_manager=tff.program.MemoryReleaseManager(),
      evaluation_manager=None, evaluation_periodicity=1))
  return asyncio.run(state_manager.get_versions())[-1]


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--program_dir', default=None)
  args = parser.parse_args(argv)
  # Explicit: TFF's worker_binary dies with this program; nothing was patched at import.
  runtime.use_local_cpp_context()
  data = client_data()
  for name, build in builders().items():
    for agg_name, agg in aggregators().items():
      process = build(agg)
      state, metrics = train(process, data, args.rounds)
      assert isinstance(state, tff.learning.templates.LearningAlgorithmState)
      assert {'distributor', 'client_work', 'aggregator', 'finalizer'} <= set(metrics)
      loss = evaluate(process.get_model_weights(state), data)
      print(f'{name:14s} {agg_name:7s} {args.rounds} rounds: eval loss {loss:.4f}, '
            f'upload bits/client {float(metrics["cost"]["upload_bits_per_client"]):.0f}')
  program_dir = args.program_dir or tempfile.mkdtemp(prefix='quickstart_program_')
  # tff.program logic needs a FederatedContext (value references, not values).
  runtime.use_local_cpp_program_context()
  process = builders()['fedgbo'](None)
  first = run_program(process, data, program_dir, total_rounds=1)
  resumed = run_program(process, data, program_dir, total_rounds=args.rounds + 1)
  print(f'train_model: stopped after round {first}, resumed to round {resumed} '
        f'({program_dir})')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
