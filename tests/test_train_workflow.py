"""Issue 20: every algorithm runs with its defaults, grouped help, run names, own tasks, aggregators.

Runs go through `cli.config_from_args` (bin/train's own flags, preset and
algorithm defaults, parsed on a private FlagValues) and `cli.run_training`,
in this process: the same path as `bin/train.py ARGS`, without a TensorFlow
start-up per run.
"""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from workflow import algorithms
from workflow import cli
from workflow import train_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'bin', 'train.py')
# Task and loop flags only (no algorithm flag): tiny digits, one evaluation.
TINY = ['--task=digits', '--num_clients=4', '--clients_per_round=2', '--client_batch_size=32',
        '--rounds_per_eval=1', '--show_progress=false']


def _run(tmp_path, *args):
  cfg, notes = cli.config_from_args([*TINY, f'--root_output_dir={tmp_path}', *args])
  _, row = cli.run_training(cfg, notes)
  return cfg, notes, row


def _rounds(run_dir):
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return [r['round'] for r in csv.DictReader(f)]


def test_every_algorithm_runs_with_only_its_name(tmp_path, capsys):
  cases = [[f'--algorithm={name}'] for name in algorithms.ALGORITHMS]
  cases.append(['--algorithm=fedada2', '--preconditioner=dja'])  # dense clients by default
  for args in cases:
    cfg, notes, row = _run(tmp_path, *args, '--total_rounds=1')
    assert np.isfinite(row['eval/loss']), args
    assert _rounds(cli.experiment_dir(cfg)) == ['1'], args
  err = capsys.readouterr().err
  # The defaults are printed when the run starts.
  assert "fedgbo: --client_optimizer=adam (this algorithm's default)" in err
  assert "fedgbo: --local_steps=10 (this algorithm's default)" in err
  assert "mtfl: --digits_model=cnn_bn (this algorithm's default)" in err
  assert "fedada2: --client_optimizer=adam (this algorithm's default)" in err  # with dja
  assert "ce_fedavg: --upload_compression=topk_uniq (this algorithm's default)" in err


def test_explicit_flags_win_and_contradictions_fail_in_one_line():
  cfg, notes = cli.config_from_args(['--algorithm=fedgbo', '--client_optimizer=rmsprop'])
  assert cfg['client_optimizer'] == 'rmsprop' and cfg['local_steps'] == 10
  assert notes == ["fedgbo: --local_steps=10 (this algorithm's default)"]
  cfg, _ = cli.config_from_args(['--algorithm=fedadam', '--server_learning_rate=0.5'])
  assert cfg['server_learning_rate'] == 0.5
  cfg, notes = cli.config_from_args(['--algorithm=fedadam'])
  assert cfg['server_learning_rate'] == 0.01 and len(notes) == 1
  for args, flag in ((['--algorithm=fedgbo', '--local_steps=0'], '--local_steps'),
                     (['--algorithm=mfl', '--client_optimizer=sgd'], '--client_optimizer'),
                     (['--algorithm=ce_fedavg', '--upload_compression=none'],
                      '--upload_compression')):
    cfg, _ = cli.config_from_args(args)
    with pytest.raises((cli.UsageError, algorithms.ConfigError)) as error:
      cli.validate(cfg)
      algorithms.build(cfg['algorithm'], None, cfg)
    assert flag in str(error.value) and '\n' not in str(error.value)
  # A preset's flags count as given: the algorithm's default does not override them.
  cfg, notes = cli.config_from_args(['--preset=fedgbo:femnist', '--algorithm=fedgbo'])
  assert cfg['local_steps'] == 10 and cfg['client_optimizer'] == 'adam'
  assert notes[0].startswith('--preset=fedgbo:femnist sets')


def test_help_is_grouped_with_values_defaults_and_readers():
  text = train_flags.grouped_help()
  titles = [title for _, title, _ in train_flags.GROUPS]
  positions = [text.index(f'\n{title}:\n') for title in titles]
  assert positions == sorted(positions) and len(titles) >= 9
  assert len(train_flags.FLAGS_BY_NAME) >= 94
  block = text[text.index('  --fedgbo_upload'):text.index('  --mfl_bias_correction')]
  assert 'values: model | average_gradient' in block and 'read by: fedgbo' in block
  block = text[text.index('  --client_optimizer'):text.index('  --client_learning_rate')]
  assert 'fedgbo, mfl: sgdm | rmsprop | adam' in block and 'fedgbo: adam' in block
  block = text[text.index('  --aggregator ('):text.index('  --aggregator_zeroing')]
  assert 'values: mean | robust | secure' in block
  train_flags.check_table(algorithms.ALGORITHMS)
  # The binary: --help is this text; --helpfull has one absl section per group.
  short = subprocess.run([sys.executable, TRAIN, '--help'], capture_output=True, text=True,
                         timeout=300)
  assert short.returncode == 0 and 'Client: sampling, local work, client optimiser:' in short.stdout
  full = subprocess.run([sys.executable, TRAIN, '--helpfull'], capture_output=True, text=True,
                        timeout=300)
  sections = [line for line in full.stdout.splitlines() if line.startswith('bin/train.py flags')]
  assert len(sections) == len(train_flags.GROUPS), sections


def test_run_names_differ_by_setting_and_reruns_resume(tmp_path, capsys):
  cfg_a, _, _ = _run(tmp_path, '--total_rounds=1')
  cfg_b, _, _ = _run(tmp_path, '--total_rounds=1', '--client_learning_rate=0.05')
  dir_a, dir_b = cli.experiment_dir(cfg_a), cli.experiment_dir(cfg_b)
  assert dir_a != dir_b
  assert os.path.basename(dir_b) == (
      'digits_fedavg-client_batch_size=32-client_learning_rate=0.05-clients_per_round=2-'
      'num_clients=4')
  capsys.readouterr()
  # The same commands again (with more rounds, a loop flag): each resumes its own run.
  for cfg, args in ((cfg_a, ()), (cfg_b, ('--client_learning_rate=0.05',))):
    again, _, _ = _run(tmp_path, '--total_rounds=2', *args)
    assert cli.experiment_dir(again) == cli.experiment_dir(cfg)
    assert 'Resuming from the checkpoint after round 1' in capsys.readouterr().err
    assert _rounds(cli.experiment_dir(cfg)) == ['1', '2']
  # An algorithm's defaults are not part of its name; long suffixes end in a hash.
  assert cli.default_experiment_name(cli.config_from_args(['--algorithm=fedgbo'])[0]) == (
      'digits_fedgbo')
  long_cfg, _ = cli.config_from_args([
      '--algorithm=fedadam', '--client_learning_rate=0.3', '--server_beta_1=0.5',
      '--server_beta_2=0.9', '--server_epsilon=0.01', '--client_batch_size=7', '--seed=3'])
  name = cli.default_experiment_name(long_cfg)
  assert name.startswith('digits_fedadam-client_batch_size=7') and len(name) < 110
  other = cli.default_experiment_name({**long_cfg, 'seed': 4})
  assert other != name


def test_user_defined_task_from_outside_tasks(tmp_path):
  cfg, _, row = _run(tmp_path, '--task=tests.custom_task_fixture:make_task', '--total_rounds=2',
                     '--algorithm=fedadam')
  assert os.path.basename(cli.experiment_dir(cfg)).startswith(
      'tests.custom_task_fixture.make_task_fedadam')
  assert _rounds(cli.experiment_dir(cfg)) == ['1', '2']
  assert 0.0 <= row['eval/accuracy'] <= 1.0
  with pytest.raises(cli.UsageError, match='--task=tests.nothing_here:make_task'):
    cli.validate({**cfg, 'task': 'tests.nothing_here:make_task'})
  with pytest.raises(cli.UsageError, match='no function'):
    cli.validate({**cfg, 'task': 'tests.custom_task_fixture:missing'})


def test_robust_and_secure_aggregators_train(tmp_path):
  plain = ['--total_rounds=2', '--algorithm=fedavg', '--aggregator_zeroing=false',
           '--aggregator_clipping=false']
  mean_cfg, _, mean_row = _run(tmp_path, *plain)
  secure_cfg, _, secure_row = _run(tmp_path, *plain, '--aggregator=secure')
  robust_cfg, _, robust_row = _run(tmp_path, '--total_rounds=2', '--algorithm=fedavgm',
                                   '--aggregator=robust')
  assert np.isfinite(robust_row['eval/loss'])
  assert len({cli.experiment_dir(c) for c in (mean_cfg, secure_cfg, robust_cfg)}) == 3
  # Secure sums quantise to 32-bit integers: the same model as the mean, to float tolerance,
  # after two rounds (the second trains from the first's aggregate).
  compared = [k for k in mean_row if k.startswith(('eval/', 'train/')) and k in secure_row]
  assert 'eval/loss' in compared and 'train/client_work/train/loss' in compared, compared
  for key in compared:
    assert secure_row[key] == pytest.approx(mean_row[key], rel=1e-4, abs=1e-5), key
  with pytest.raises(cli.UsageError, match='--aggregator=robust cannot be combined with --dp'):
    cli.validate({**robust_cfg, 'dp': True, 'dp_clip_norm': 1.0, 'dp_noise_multiplier': 0.1})
