"""Every algorithm runs with its defaults, grouped help, run names, own tasks, aggregators.

Runs go through `cli.config_from_args` (bin/train's own flags, preset and
algorithm defaults, parsed on a private FlagValues) and `cli.run_training`,
in this process: the same path as `bin/train.py ARGS`, without a TensorFlow
start-up per run.
"""

import contextlib
import csv
import io
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

from tasks import fixtures
from workflow import errors
from workflow.flags import algorithms
from workflow.flags import config
from workflow.flags import train_flags
from workflow.flags import train_help
from workflow.flags import validation
from workflow.reporting import plotting
from workflow.reporting import report
from workflow.sweeps import selection
from workflow.sweeps import sweep
from workflow.sweeps import sweep_runner
from workflow.training import algorithm_builders
from workflow.training import cli
from workflow.training import experiment
from workflow.training import tensorboard_hparams

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'bin', 'train.py')
# Task and loop flags only (no algorithm flag): tiny digits, one evaluation.
TINY = ['--task=digits', '--num_clients=4', '--clients_per_round=2', '--client_batch_size=32',
        '--rounds_per_eval=1', '--show_progress=false']


def _run(tmp_path, *args, default_execution=False):
  """An in-process run; its clients in sequence (the cheaper trace, tests/train_config.py)
  unless `default_execution`."""
  execution = [] if default_execution else ['--cohort_mode=sequential']
  settings, notes = cli.config_from_args([*TINY, f'--root_output_dir={tmp_path}', *execution,
                                          *args])
  _, row = cli.run_training(settings, notes)
  return settings, notes, row


def _rounds(run_dir):
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return [r['round'] for r in csv.DictReader(f)]


def _texts(artists):
  return [a.get_text() for a in artists]


ONLY_ITS_NAME = {name: [f'--algorithm={name}'] for name in algorithms.ALGORITHMS}
ONLY_ITS_NAME['fedada2_dja'] = ['--algorithm=fedada2', '--preconditioner=dja']  # dense clients
# The defaults are printed when the run starts.
DEFAULT_LINES = {
    'fedgbo': ["fedgbo: --client_optimizer=adam (this algorithm's default)",
               "fedgbo: --local_steps=10 (this algorithm's default)"],
    'mtfl': ["mtfl: --digits_model=cnn_bn (this algorithm's default)"],
    'fedada2_dja': ["fedada2: --client_optimizer=adam (this algorithm's default)"],
    'ce_fedavg': ["ce_fedavg: --upload_compression=topk_uniq (this algorithm's default)"],
}


def test_every_algorithm_has_defaults():
  """Each entry holds its defaults (no other table), and they are bin/train flags."""
  for name, entry in algorithms.ALGORITHMS.items():
    defaults = entry.defaults(config.from_flags({'algorithm': name}))
    assert set(defaults) <= set(train_flags.TRAIN_FLAG_NAMES), name


# These by-name runs take bin/train's default execution, the others run their
# clients in sequence (the cheaper trace): what this file checks is each registry
# entry's flags and defaults; each algorithm's default execution is compared with
# its per-client round in test_cohort.py and its own test file.
DEFAULT_EXECUTION = ('fedavg', 'fedadam')  # the demo's runs


@pytest.fixture(scope='module')
def run_by_name(tmp_path_factory):
  """case -> (settings, last row, stderr) of its one-round run with only its name given,
  run once for the module."""
  root, done = tmp_path_factory.mktemp('by_name'), {}

  def run(case):
    if case not in done:
      err = io.StringIO()
      with contextlib.redirect_stderr(err):
        settings, _, row = _run(root, *ONLY_ITS_NAME[case], '--total_rounds=1',
                                default_execution=case in DEFAULT_EXECUTION)
      done[case] = (settings, row, err.getvalue())
    return done[case]
  return run


@pytest.mark.parametrize('case', sorted(ONLY_ITS_NAME))
def test_every_algorithm_runs_with_only_its_name(case, run_by_name):
  settings, row, err = run_by_name(case)
  assert np.isfinite(row['eval/loss'])
  assert _rounds(experiment.experiment_dir(settings)) == ['1']
  for line in DEFAULT_LINES.get(case, ()):
    assert line in err
  if case in ('perfedavg', 'pfedme'):  # recipes of the round engine: a cohort, with UA
    assert 'cohort_padding_waste' in row and np.isfinite(row['ua/mean'])
    assert np.isfinite(row['ua_all/mean'])  # every client's UA, on the evaluation round
  if case == 'fedgbo':  # the run's flags as a TensorBoard HParams session, beside its scalars
    hparams = tensorboard_hparams.read_hparams(
        os.path.join(experiment.experiment_dir(settings), 'tensorboard'))
    assert hparams['algorithm'] == 'fedgbo' and hparams['client_optimizer'] == 'adam'
    assert hparams['local_steps'] == 10 and 'root_output_dir' not in hparams


def _execution_line(capsys):
  return next(l for l in capsys.readouterr().err.splitlines() if l.startswith('execution: '))


def test_mtfl_runs_as_a_cohort_unless_its_batch_norm_is_fused(tmp_path, capsys):
  # MNIST's MTFL 2NN: batch norm on dense layers, which the cohort program computes.
  fixtures.write_keras_mnist(str(tmp_path / 'keras'), train=200, test=100)
  _, _, row = _run(tmp_path, '--algorithm=mtfl', '--task=mnist', '--mnist_model=mtfl_2nn',
                   f'--data_dir={tmp_path / "keras"}', '--total_rounds=1',
                   '--show_progress=true', default_execution=True)
  assert _execution_line(capsys).startswith('execution: cohort ('), row
  assert 'cohort_padding_waste' in row and np.isfinite(row['ua/mean'])
  # digits' default MTFL model: fused batch norm (convolutions) runs per client, and says why.
  _run(tmp_path, '--algorithm=mtfl', '--total_rounds=1', '--show_progress=true',
       default_execution=True)
  line = _execution_line(capsys)
  assert line.startswith('execution: per_client (') and 'fused batch norm' in line, line


def test_demo_plot_of_one_round_runs(run_by_name):
  """The demo's plot (bin/demo.sh: bin/plot.py over two runs), of one-round runs."""
  run_dirs = [experiment.experiment_dir(run_by_name(name)[0]) for name in ('fedavg', 'fedadam')]
  fig = plotting.plot_runs_figure(run_dirs, metrics=('eval/accuracy', 'eval/loss'))
  title = fig._suptitle.get_text()  # pylint: disable=protected-access
  assert title.startswith('digits: ') and 'num_clients=4' in title and 'clients_per_round=2' in title
  assert [ax.get_xlabel() for ax in fig.axes] == ['round', 'round']
  assert [ax.get_ylabel() for ax in fig.axes] == ['test accuracy', 'test loss']
  # Each algorithm's own server lr is its default: the legend is the algorithms alone.
  assert _texts(fig.legends[0].get_texts()) == ['fedavg', 'fedadam']
  assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ['1']
  plotting.plt.close(fig)


def test_explicit_flags_win_and_contradictions_fail_in_one_line():
  settings, notes = cli.config_from_args(['--algorithm=fedgbo', '--client_optimizer=rmsprop'])
  assert settings.client.client_optimizer == 'rmsprop' and settings.client.local_steps == 10
  assert notes == ["fedgbo: --local_steps=10 (this algorithm's default)"]
  settings, _ = cli.config_from_args(['--algorithm=fedadam', '--server_learning_rate=0.5'])
  assert settings.server.server_learning_rate == 0.5
  settings, notes = cli.config_from_args(['--algorithm=fedadam'])
  assert settings.server.server_learning_rate == 0.01 and len(notes) == 1
  for args, flag in ((['--algorithm=fedgbo', '--local_steps=0'], '--local_steps'),
                     (['--algorithm=mfl', '--client_optimizer=sgd'], '--client_optimizer'),
                     (['--algorithm=ce_fedavg', '--upload_compression=none'],
                      '--upload_compression')):
    settings, _ = cli.config_from_args(args)
    with pytest.raises((errors.UsageError, algorithms.ConfigError)) as error:
      validation.validate(settings)
      algorithm_builders.build(None, settings)
    assert flag in str(error.value) and '\n' not in str(error.value)
  # A preset's flags count as given: the algorithm's default does not override them.
  settings, notes = cli.config_from_args(['--preset=fedgbo:femnist', '--algorithm=fedgbo'])
  assert settings.client.local_steps == 10 and settings.client.client_optimizer == 'adam'
  assert notes[0].startswith('--preset=fedgbo:femnist sets')


def test_help_is_grouped_with_values_defaults_and_readers():
  text = train_help.grouped_help()
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
  train_help.check_table(algorithms.ALGORITHMS)
  # The binary: --help is this text; --helpfull has one absl section per group.
  short = subprocess.run([sys.executable, TRAIN, '--help'], capture_output=True, text=True,
                         timeout=300)
  assert short.returncode == 0 and 'Client: sampling, local work, client optimiser:' in short.stdout
  full = subprocess.run([sys.executable, TRAIN, '--helpfull'], capture_output=True, text=True,
                        timeout=300)
  sections = [line for line in full.stdout.splitlines() if line.startswith('bin/train.py flags')]
  assert len(sections) == len(train_flags.GROUPS), sections


def test_run_names_differ_by_setting_and_reruns_resume(tmp_path, capsys):
  settings_a, _, _ = _run(tmp_path, '--total_rounds=1')
  settings_b, _, _ = _run(tmp_path, '--total_rounds=1', '--client_learning_rate=0.05')
  dir_a, dir_b = experiment.experiment_dir(settings_a), experiment.experiment_dir(settings_b)
  assert dir_a != dir_b
  assert os.path.basename(dir_b) == (
      'digits_fedavg-client_batch_size=32-client_learning_rate=0.05-clients_per_round=2-'
      'num_clients=4')
  capsys.readouterr()
  # The same commands again (with more rounds, a loop flag): each resumes its own run.
  for settings, args in ((settings_a, ()), (settings_b, ('--client_learning_rate=0.05',))):
    again, _, _ = _run(tmp_path, '--total_rounds=2', *args)
    assert experiment.experiment_dir(again) == experiment.experiment_dir(settings)
    assert 'Resuming from the checkpoint after round 1' in capsys.readouterr().err
    assert _rounds(experiment.experiment_dir(settings)) == ['1', '2']
  # An algorithm's defaults are not part of its name; long suffixes end in a hash.
  assert experiment.default_experiment_name(cli.config_from_args(['--algorithm=fedgbo'])[0]) == (
      'digits_fedgbo')
  long_settings, _ = cli.config_from_args([
      '--algorithm=fedadam', '--client_learning_rate=0.3', '--server_beta_1=0.5',
      '--server_beta_2=0.9', '--server_epsilon=0.01', '--client_batch_size=7', '--seed=3'])
  name = experiment.default_experiment_name(long_settings)
  assert name.startswith('digits_fedadam-client_batch_size=7') and len(name) < 110
  other = experiment.default_experiment_name(long_settings.replace(seed=4))
  assert other != name


def test_user_defined_task_from_outside_tasks(tmp_path):
  from tests import custom_task_fixture  # pylint: disable=g-import-not-at-top,unused-import
  settings, _, row = _run(tmp_path, '--task=tests.custom_task_fixture:make_task',
                          '--total_rounds=2', '--algorithm=fedadam')
  assert os.path.basename(experiment.experiment_dir(settings)).startswith(
      'tests.custom_task_fixture.make_task_fedadam')
  assert _rounds(experiment.experiment_dir(settings)) == ['1', '2']
  assert 0.0 <= row['eval/accuracy'] <= 1.0
  with pytest.raises(errors.UsageError, match='--task=tests.nothing_here:make_task'):
    validation.validate(settings.replace(task='tests.nothing_here:make_task'))
  with pytest.raises(errors.UsageError, match='no function'):
    validation.validate(settings.replace(task='tests.custom_task_fixture:missing'))


def test_robust_and_secure_aggregators_train(tmp_path, capsys):
  plain = ['--total_rounds=2', '--algorithm=fedavg', '--aggregator_zeroing=false',
           '--aggregator_clipping=false']
  mean_settings, _, mean_row = _run(tmp_path, *plain)
  capsys.readouterr()
  # The execution line (printed with progress): secure per client, robust in the cohort program.
  secure_settings, _, secure_row = _run(tmp_path, *plain, '--aggregator=secure',
                                        '--show_progress=true')
  line = next(l for l in capsys.readouterr().err.splitlines() if l.startswith('execution: '))
  assert line.startswith('execution: per_client (the aggregator ') and line.endswith(
      ' runs per client)'), line
  robust_settings, _, robust_row = _run(tmp_path, '--total_rounds=2', '--algorithm=fedavgm',
                                        '--aggregator=robust', '--show_progress=true')
  line = next(l for l in capsys.readouterr().err.splitlines() if l.startswith('execution: '))
  assert line.startswith('execution: cohort ('), line
  assert np.isfinite(robust_row['eval/loss'])
  runs = (mean_settings, secure_settings, robust_settings)
  assert len({experiment.experiment_dir(s) for s in runs}) == 3
  # Secure sums quantise to 32-bit integers: the same model as the mean, to float tolerance,
  # after two rounds (the second trains from the first's aggregate).
  compared = [k for k in mean_row if k.startswith(('eval/', 'train/')) and k in secure_row]
  assert 'eval/loss' in compared and 'train/client_work/train/loss' in compared, compared
  for key in compared:
    assert secure_row[key] == pytest.approx(mean_row[key], rel=1e-4, abs=1e-5), key
  with pytest.raises(errors.UsageError, match='--aggregator=robust cannot be combined with --dp'):
    validation.validate(robust_settings.replace(dp=True, dp_clip_norm=1.0, dp_noise_multiplier=0.1))


def test_plot_legend_names_differing_settings_and_metric_words(tmp_path):
  runs = []
  for lr in ('0.05', '0.2'):
    settings, _ = cli.config_from_args([*TINY, '--algorithm=fedadam',
                                        f'--client_learning_rate={lr}',
                                        f'--root_output_dir={tmp_path}'])
    run = experiment.prepare_output_dir(settings)
    with open(os.path.join(run, 'metrics.csv'), 'w') as f:  # four rounds, one evaluation
      f.write('round,train/client_work/train/loss,cost/cumulative_upload_bits,eval/accuracy\n'
              '1,2.0,100,\n2,1.5,200,\n3,1.2,300,\n4,1.0,400,0.5\n')
    runs.append(run)
  fig = plotting.plot_runs_figure(runs, metrics=('eval/accuracy', 'train/client_work/train/loss'))
  assert _texts(fig.legends[0].get_texts()) == ['fedadam, client_learning_rate=0.05',
                                                'fedadam, client_learning_rate=0.2']
  assert fig.axes[1].get_ylabel() == 'training loss (sampled clients)'
  assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ['1', '2', '3', '4']
  assert 'fedadam' in fig._suptitle.get_text()  # pylint: disable=protected-access
  plotting.plt.close(fig)
  fig = plotting.plot_runs_figure(runs, x='cost/cumulative_upload_bits',
                                  metrics=('train/client_work/train/loss',))
  assert fig.axes[0].get_xlabel() == 'cumulative upload, all clients (bits)'
  plotting.plt.close(fig)
  assert plotting.metric_label('cost/client_flops') == 'client compute, all clients per round (FLOPs)'
  assert plotting.metric_label('sim/cumulative_minutes') == 'simulated time (minutes)'


def _fake_sweep(tmp_path, name, seeds):
  from tests import test_sweep_report  # pylint: disable=g-import-not-at-top
  script = tmp_path / 'fake_trial.py'
  script.write_text(test_sweep_report.FAKE_TRIAL)
  os.environ.setdefault('FAKE_CALLS', str(tmp_path / 'calls.txt'))
  sweep_dir = str(tmp_path / name)
  fixed = {'total_rounds': '10', 'task': 'digits'}
  trials = sweep.expand(sweep.parse_grid('avg: algorithm=fedavg; client_learning_rate=0.7,0.95 | '
                                         'mfl: algorithm=mfl; client_learning_rate=0.8'),
                        list(seeds), fixed)
  sweep_runner.run_sweep(trials, sweep_dir, fixed=fixed, max_parallel=2,
                         command=[sys.executable, str(script)], log=lambda _: None)
  return sweep_dir


def test_report_figure_bands_from_three_seeds_and_regenerate_line(tmp_path, monkeypatch):
  monkeypatch.setenv('FAKE_CALLS', str(tmp_path / 'calls.txt'))
  rule = selection.parse_rule('last_mean:2')
  for seeds, band in (((0, 1), False), ((0, 1, 2), True)):
    sweep_dir = _fake_sweep(tmp_path, f'sw{len(seeds)}', seeds)
    results, _ = selection.load_results(sweep_dir)
    summaries = selection.summarize(results, rule)
    fig = report.mean_curves_figure(
        report.best_curves(summaries, rule, ('round', 'cost/cumulative_upload_bits')),
        rule.metric)
    assert 'test accuracy' in fig._suptitle.get_text()  # pylint: disable=protected-access
    assert [ax.get_xlabel() for ax in fig.axes] == ['round',
                                                    'cumulative upload, all clients (bits)']
    assert {ax.get_ylabel() for ax in fig.axes} == {'test accuracy'}
    legend = _texts(fig.legends[0].get_texts())
    n = len(seeds)
    suffix = (f'(mean of {n} seeds ± 95% CI)' if band
              else f'(mean of {n} seeds; CI band from 3 seeds)')
    assert legend == [f'avg: algorithm=fedavg, client_learning_rate=0.95 {suffix}',
                      f'mfl: algorithm=mfl, client_learning_rate=0.8 {suffix}'], legend
    assert (len(fig.axes[0].collections) > 0) == band  # fill_between bands
    ticks = [float(t) for t in fig.axes[0].get_xticks()]
    assert ticks == [int(t) for t in ticks]
    report.plt.close(fig)
  # bin/report.py: the "Regenerate with" line is the command that ran.
  out = tmp_path / 'rep' / 'r.md'
  command = [sys.executable, os.path.join(ROOT, 'bin', 'report.py'), f'--sweep_dir={sweep_dir}',
             f'--out={out}', '--select_rule=last_mean:2', '--title=Fake sweep']
  done = subprocess.run(command, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  text = out.read_text()
  assert f'    {shlex.join(command)}\n' in text
  assert os.path.getsize(tmp_path / 'rep' / 'r_curves.png') > 5000


def test_first_eval_round_evaluates_only_the_last_window(tmp_path):
  """--first_eval_round=4 with --rounds_per_eval=2 over 7 rounds: rounds 4, 6 and the
  last, each with its eval_seconds."""
  settings, _, _ = _run(tmp_path, '--algorithm=fedavg', '--total_rounds=7', '--rounds_per_eval=2',
                        '--first_eval_round=4')
  with open(os.path.join(experiment.experiment_dir(settings), 'metrics.csv'), newline='') as f:
    rows = list(csv.DictReader(f))
  evaluated = [r['round'] for r in rows if r.get('eval/loss')]
  assert evaluated == ['4', '6', '7']
  # What each evaluation took, on its rows only (round_seconds leaves it out).
  assert [r['round'] for r in rows if r.get('eval_seconds')] == evaluated
  assert all(float(r['eval_seconds']) > 0 for r in rows if r.get('eval_seconds'))


def test_first_eval_round_refuses_a_schedule_that_watches_evaluations():
  with pytest.raises(errors.UsageError, match='--first_eval_round must be 0 with '
                     '--client_lr_schedule=step'):
    settings, _ = cli.config_from_args([*TINY, '--algorithm=fedavg', '--client_lr_schedule=step',
                                        '--first_eval_round=3'])
    validation.validate(settings)


def test_rounds_per_eval_changes_on_resume_only_without_a_step_schedule(tmp_path, capsys):
  """--rounds_per_eval is a resumable change, except under a `step` schedule,
  which decays on evaluations (a changed cadence would change the run)."""
  plain = ('--algorithm=fedavg', '--experiment_name=plain')
  _run(tmp_path, *plain, '--total_rounds=1', '--rounds_per_eval=1')
  again, _, _ = _run(tmp_path, *plain, '--total_rounds=2', '--rounds_per_eval=2')
  assert 'Resuming from the checkpoint after round 1' in capsys.readouterr().err
  assert _rounds(experiment.experiment_dir(again)) == ['1', '2']
  stepped = ('--algorithm=fedavg', '--client_lr_schedule=step', '--experiment_name=stepped')
  _run(tmp_path, *stepped, '--total_rounds=1', '--rounds_per_eval=1')
  with pytest.raises(errors.UsageError, match=r"--rounds_per_eval=2 \(saved 1\) "
                     r'\(--client_lr_schedule=step decays on evaluations\)'):
    _run(tmp_path, *stepped, '--total_rounds=2', '--rounds_per_eval=2')
