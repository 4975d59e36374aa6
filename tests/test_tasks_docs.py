"""Every command of the task table in docs/tasks.md runs on fixtures.

Each `bin/train.py ...` command of the table is parsed by bin/train's own
flags and validated. Its --data_dir is replaced by fixture files in the task's
real format, and, to keep the test cheap, --total_rounds by 1, --local_steps
by at most 2, --clients_per_round by at most 2 and --num_clients by at most
the fixture's clients. The first command of each file-based task then trains
and evaluates for one round through `cli.run_training`, its clients in sequence
without XLA, the cheapest program to build (what is checked is the row's task,
model and flags; every execution equals the per-client round in test_cohort.py
and test_recurrent_cohort.py; the recurrent tasks' default program took up to
52 s to build here) (ResNet-18, whose
single CPU round costs minutes, is only built); the task's other commands,
and the offline `digits`/`synthetic` rows (trained by their own tests), build
their task and check the batches their flags ask for.
"""

import csv
import importlib.util
import math
import os
import re
import shlex

import pytest
from absl import flags

from tasks import fixtures
from tasks import registry
from workflow.flags import config
from workflow.flags import train_flags
from workflow.flags import validation
from workflow.training import cli

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, 'docs', 'tasks.md')
# Where each task's fixture lives inside the fixture root, and how many clients it has.
FIXTURE = {
    'cifar100_image': ('tff', 3), 'emnist_character': ('tff', 3), 'emnist_autoencoder': ('tff', 3),
    'shakespeare_character': ('tff', 3), 'stackoverflow_word': ('tff', 3),
    'stackoverflow_tag': ('tff', 3), 'sent140': ('sent140', 4), 'femnist': ('femnist', 5),
    'shakespeare_leaf': ('shakespeare', 3), 'mnist': ('keras', 10), 'cifar10': ('keras', 10),
}
NOT_TRAINED = {('cifar100_image', 'resnet18')}


def _table_rows() -> list[tuple[str, list[str]]]:
  """(task, commands) for each row of the task table."""
  rows = []
  with open(DOC) as f:
    for line in f:
      cells = [c.strip() for c in line.strip().strip('|').split('|')]
      match = re.fullmatch(r'`(\w+)`', cells[0]) if line.startswith('| `') else None
      if match:
        rows.append((match.group(1), re.findall(r'`(bin/train\.py [^`]*)`', cells[-1])))
  return rows


def _commands() -> list[tuple[str, int, str]]:
  commands = []
  for task, row_commands in _table_rows():
    commands += [(task, i, command) for i, command in enumerate(row_commands)]
  return commands


def test_every_task_has_a_row_with_commands_for_itself():
  rows = dict(_table_rows())
  assert set(FIXTURE) | {'digits', 'synthetic'} == set(rows)
  assert set(rows) <= set(registry.TASKS)
  for task, commands in rows.items():
    assert commands, task
    assert all(f'--task={task} ' in c + ' ' for c in commands), task


def _train_flags() -> flags.FlagValues:
  """bin/train's flags (defined once per process, whoever imports it first)."""
  if 'cifar10_model' not in flags.FLAGS:
    spec = importlib.util.spec_from_file_location('tff_adaptive_bin_train',
                                                  os.path.join(ROOT, 'bin', 'train.py'))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
  return flags.FLAGS


def _parse(command: str) -> dict:
  values = _train_flags()
  values.unparse_flags()
  try:
    values(shlex.split(command))
    return {name: values[name].value for name in train_flags.TRAIN_FLAG_NAMES if name in values}
  finally:
    values.unparse_flags()


@pytest.fixture(scope='module')
def fixture_root(tmp_path_factory):
  root = tmp_path_factory.mktemp('task_fixtures')
  fixtures.write_tff_all(str(root / 'tff'))
  fixtures.write_leaf_sent140(str(root / 'sent140'))
  fixtures.write_leaf_femnist(str(root / 'femnist'))
  fixtures.write_leaf_shakespeare(str(root / 'shakespeare'))
  fixtures.write_keras_mnist(str(root / 'keras'), train=400, test=200)
  fixtures.write_keras_cifar10(str(root / 'keras'), per_batch=40, test=100)
  return root


def _model(cfg):
  return cfg.get(f'{cfg["task"]}_model')


def _first_trainable_command(task):
  for t, i, command in _commands():
    if t == task and (t, _model(_parse(command))) not in NOT_TRAINED:
      return i
  return None


@pytest.mark.parametrize('task,index,command', _commands(),
                         ids=[f'{t}-{i}' for t, i, _ in _commands()])
def test_table_command_runs_on_fixtures(fixture_root, tmp_path, task, index, command):
  cfg = _parse(command)
  assert cfg['task'] == task
  validation.validate(config.from_flags(cfg))  # the documented flags are valid as written
  if task in FIXTURE:
    subdir, clients = FIXTURE[task]
    cfg['data_dir'] = str(fixture_root / subdir)
    cfg['num_clients'] = min(cfg['num_clients'], clients - 1 if subdir == 'tff' else clients)
  cfg.update(total_rounds=1, rounds_per_eval=1, rounds_per_checkpoint=1, show_progress=False,
             local_steps=min(cfg['local_steps'], 2),
             clients_per_round=min(cfg['clients_per_round'], 2), root_output_dir=str(tmp_path),
             experiment_name='row', cohort_mode='sequential', cohort_jit_compile='none')
  settings = config.from_flags(cfg)
  built = registry.create_task(settings.task, batch_size=settings.client.client_batch_size,
                               num_epochs=config.num_epochs(settings), seed=settings.loop.seed)
  batch = next(iter(built.preprocess_train(
      built.train_data.create_tf_dataset_for_client(built.train_data.client_ids[0]))))
  leading = [t.shape[0] for t in (batch.values() if isinstance(batch, dict) else batch)]
  assert all(0 < n <= cfg['client_batch_size'] for n in leading)
  if (task, _model(cfg)) in NOT_TRAINED:
    return  # its model is built (and checked) in test_tasks_models.py
  if task not in FIXTURE or index != _first_trainable_command(task):
    assert built.keras_model_fn().count_params() > 0
    return
  _, row = cli.run_training(config.from_flags(cfg))
  evaluated = {k: v for k, v in row.items() if k.startswith('eval/')}
  assert 'eval/loss' in evaluated and all(math.isfinite(v) for v in evaluated.values())
  with open(os.path.join(tmp_path, 'row', 'metrics.csv')) as f:
    assert [r['round'] for r in csv.DictReader(f)] == ['1']
