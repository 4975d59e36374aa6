"""Paper presets (`bin/train --preset=<paper>:<task>`): documented, valid, overridable, runnable."""

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tasks import fixtures
from workflow.flags import config
from workflow.flags import presets
from workflow.flags import train_flags
from workflow.flags import validation

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'bin', 'train.py')
DOC = os.path.join(ROOT, 'docs', 'tasks.md')


def _documented_commands() -> list[dict[str, str]]:
  """docs/tasks.md's bin/train commands as {flag: value} (without --data_dir)."""
  with open(DOC) as f:
    text = f.read()
  commands = []
  for command in re.findall(r'`bin/train\.py ([^`]*)`', text):
    flag_values = dict(a[2:].split('=', 1) if '=' in a else (a[2:], 'true')
                       for a in command.split() if a.startswith('--'))
    flag_values.pop('data_dir', None)
    commands.append(flag_values)
  return commands


def test_issue_examples_exist_and_names_are_paper_colon_task():
  for name in ('fedgbo:cifar100', 'fedopt:emnist_character', 'decayk:femnist'):
    assert name in presets.PRESETS
  papers = {'fedopt', 'fedgbo', 'decayk', 'thesis3', 'thesis4', 'thesis5'}
  for name, flag_values in presets.PRESETS.items():
    paper, _ = name.split(':')
    assert paper in papers, name
    assert 'data_dir' not in flag_values, name


@pytest.mark.parametrize('name', sorted(presets.PRESETS))
def test_preset_is_a_documented_command(name):
  assert dict(presets.PRESETS[name]) in _documented_commands(), (
      f'{name} differs from every command of docs/tasks.md')


def test_unknown_preset_exits_2_with_the_list(tmp_path):
  proc = subprocess.run([sys.executable, TRAIN, '--preset=fedgbo:imagenet',
                         f'--root_output_dir={tmp_path}'], capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and '--preset must be one of' in lines[0] and 'fedgbo:femnist' in lines[0]
  assert not os.listdir(tmp_path)


def test_preset_runs_on_fixture_and_command_line_wins(tmp_path):
  data = tmp_path / 'femnist'
  fixtures.write_leaf_femnist(str(data))
  out = tmp_path / 'runs'
  proc = subprocess.run(
      [sys.executable, TRAIN, '--preset=decayk:femnist', f'--data_dir={data}',
       # the fixture has 5 writers; shrink the run, everything else from the preset
       '--num_clients=5', '--clients_per_round=2', '--local_steps=2', '--total_rounds=1',
       '--rounds_per_eval=1', '--show_progress=false', f'--root_output_dir={out}',
       '--experiment_name=preset'], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert '--preset=decayk:femnist sets' in proc.stderr
  with open(out / 'preset' / 'flags.json') as f:
    recorded = json.load(f)
  preset = presets.PRESETS['decayk:femnist']
  # From the preset:
  assert recorded['femnist_model'] == 'cnn' and recorded['client_batch_size'] == 32
  assert recorded['client_learning_rate'] == float(preset['client_learning_rate'])
  # From the command line, over the preset's 1000 clients, 10 per round, K = 10, 4000 rounds:
  assert (recorded['num_clients'], recorded['clients_per_round'], recorded['local_steps'],
          recorded['total_rounds']) == (5, 2, 2, 1)
  with open(out / 'preset' / 'metrics.csv') as f:
    assert [r['round'] for r in csv.DictReader(f)] == ['1']


def _train_flags():
  """bin/train's flags (defined once per process, whoever imports it first)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  if 'cifar10_model' not in flags.FLAGS:
    spec = importlib.util.spec_from_file_location('tff_adaptive_bin_train', TRAIN)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
  return flags.FLAGS


@pytest.mark.parametrize('name', sorted(presets.PRESETS))
def test_every_preset_validates(name):
  values = _train_flags()
  values.unparse_flags()
  try:
    values(['bin/train.py', f'--preset={name}'])
    presets.apply(name, values)
    cfg = {k: values[k].value for k in train_flags.TRAIN_FLAG_NAMES if k in values}
  finally:
    values.unparse_flags()
  for flag, value in presets.PRESETS[name].items():
    assert str(cfg[flag]) == value or cfg[flag] == type(cfg[flag])(value), flag
  validation.validate(config.from_flags(cfg))
