"""Smoke test of bench/run.py (issues 10, 23): tiny sizes, schema and finite ratios.

No timing assertion: the machine is shared; only the code path, the JSON
schema and the cohort rows' equality to the per-client rows are checked.
"""

import json
import math
import os
import sys

import pytest
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))

# pylint: disable=g-import-not-at-top
import bench_rounds  # first: it puts the checkout on sys.path
import bench_cohort
import bench_results
import bench_sections
import run as bench

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow


# Every cohort execution of FedAvg (the default --cohort_executions); tff_fedavg
# has no cohort form.
COHORT_ROWS = ('fedavg@cohort_vec', 'fedavg@cohort_seq', 'fedavg@cohort_vec_cpp',
               'fedavg@cohort_seq_xla', 'fedavg@cohort_vec_xlaprog', 'fedavg@cohort_seq_xlaprog',
               'fedavg@cohort_vec_xlaprog_bg', 'fedavg@cohort_seq_xlaprog_bg', 'fedavg@cohort_vec_bg')


@pytest.fixture(scope='module')
def results(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('bench'))
  written = bench.main([
      f'--out_dir={out}', '--sections=overhead,scaling,memory', '--model=linear', '--clients=2',
      '--local_steps=2', '--batch=4', '--reps=2', '--algorithms=fedavg,tff_fedavg',
      '--data=ids', '--profile_rounds=1', '--scaling_models=linear',
      '--scaling_algorithms=tff_fedavg', '--scaling_clients=2', '--memory_rounds=4',
      '--memory_model=linear', '--memory_algorithm=tff_fedavg'])
  return out, written


def _load(path):
  with open(path) as f:
    return json.load(f)


def test_writes_every_section_and_the_table(results):
  out, written = results
  names = sorted(os.path.basename(p) for p in written)
  # Kept small (few process builds): one data mode; the python-datasets mode
  # shares every line but `Setting.python_datasets`, checked below.
  assert names == ['memory_ids.json', 'overhead.json', 'scaling.json']
  table = open(os.path.join(out, 'README.md')).read()
  assert '## overhead' in table and 'tff_fedavg' in table and 'nproc=' in table
  for name in COHORT_ROWS:
    assert f'| {name} | arrays |' in table
  assert 'Targets: fastest FedAvg cohort row fedavg@' in table
  assert 'every cohort update equals the per-client one' in table


def test_overhead_schema_and_ratios(results):
  out, _ = results
  data = _load(os.path.join(out, 'overhead.json'))
  assert data['schema_version'] == bench_results.SCHEMA_VERSION
  assert set(data['machine']) >= {'nproc', 'cpu_model', 'memory_gib', 'load_average'}
  assert len(data['load_before']) == 3 and len(data['load_after']) == 3
  rows = {(r['algorithm'], r['data']): r for r in data['rows']}
  assert set(rows) == {('fedavg', 'ids'), ('tff_fedavg', 'ids')} | {
      (name, 'arrays') for name in COHORT_ROWS}
  for r in rows.values():
    for key in ('round_s', 'raw_s', 'ratio', 'ratio_per_rep_median', 'first_round_s',
                'raw_pipeline_s', 'ratio_to_raw_pipeline',
                'first_round_over_round', 'ratio_to_fedavg'):
      assert math.isfinite(r[key]) and r[key] > 0, (key, r)
    assert len(data['times_s'][f"{r['algorithm']}/{r['data']}"]) == 2
  assert rows[('fedavg', 'ids')]['ratio_to_fedavg'] == pytest.approx(1.0)
  assert 'function calls' in data['profiles']['fedavg/ids']


def test_scaling_and_memory(results):
  out, _ = results
  scaling = _load(os.path.join(out, 'scaling.json'))
  assert len(scaling['entries']) == 1
  assert all(math.isfinite(e['ratio']) and e['ratio'] > 0 for e in scaling['entries'])
  # (ru_maxrss is updated lazily by the kernel: it may trail the current RSS slightly.)
  assert all(e['peak_rss_mib'] > 0 and e['rss_mib'] > 0 for e in scaling['entries'])
  assert math.isfinite(_load(os.path.join(out, 'overhead.json'))['raw_pipeline_over_raw'])
  memory = _load(os.path.join(out, 'memory_ids.json'))
  assert memory['rounds'] == 4 and len(memory['rss_kib']) == 4
  assert memory['peak_rss_kib'] > 0 and math.isfinite(memory['slope_second_half_kib_per_round'])
  # The executor's process is measured too (it holds the values between calls).
  assert len(memory['worker_rss_kib']) == 4 and memory['worker_peak_rss_kib'] > 0
  assert math.isfinite(memory['worker_slope_second_half_kib_per_round'])


def test_rounds_train_the_same_data_as_raw():
  # The executor-side dataset (from a seed) equals the raw loop's tensors.
  setting = bench_rounds.Setting('linear', clients=2, steps=2, batch=3)
  x, y = setting.client_tensors(1)
  batches = list(setting.client_dataset(1))
  assert len(batches) == 2 and batches[0][0].shape == (3, 60)
  assert (batches[1][1].numpy() == y.numpy()[3:]).all()
  assert (batches[0][0].numpy() == x.numpy()[:3]).all()
  python = setting.python_datasets()
  assert len(python) == 2 and (list(python[1])[0][0].numpy() == x.numpy()[:3]).all()




# -- cohort rows ---------------------------------------------------


def test_cohort_rows_update_equals_per_client(results):
  out, _ = results
  data = _load(os.path.join(out, 'overhead.json'))
  rows = {r['algorithm']: r for r in data['rows']}
  for name in COHORT_ROWS:
    r = rows[name]
    assert r['data'] == 'arrays' and r['execution'] == name.split('@')[1]
    # Same initial weights and batches as the per-client row: the same update.
    assert r['update_max_abs'] > 1e-4, r  # the round moved the weights
    assert r['update_max_abs_diff'] <= 1e-5 and r['update_equal'], r
    for key in ('pad_s', 'data_s'):
      assert math.isfinite(r[key]) and r[key] >= 0, (key, r)
  assert rows['fedavg@cohort_vec']['execution_mode'] == 'vectorized'
  assert rows['fedavg@cohort_seq']['execution_mode'] == 'sequential'
  assert not rows['fedavg@cohort_vec_cpp']['in_process']
  assert rows['fedavg@cohort_seq_xla']['jit_compile'] is True
  assert rows['fedavg@cohort_vec_xlaprog']['jit_compile'] == 'program'
  targets = data['targets']
  assert targets['all_updates_equal'] and targets['best_fedavg_cohort'] in COHORT_ROWS
  assert targets['tff_fedavg_over_best_cohort'] > 0
  assert data['cohort_skipped'] == {} and data['cohort_failed'] == {}


def test_targets_compare_adaptive_rows_with_fedavg_run_the_same_way():
  row = lambda name, round_s, ratio_to_fedavg: dict(
      algorithm=name, round_s=round_s, ratio=round_s / 0.5, ratio_to_fedavg=ratio_to_fedavg,
      update_equal=True)
  rows = [row('fedavg', 2.0, 1.0), row('tff_fedavg', 8.0, 4.0),
          row('fedavg@cohort_vec', 0.2, 1.0), row('fedavg@cohort_seq', 0.4, 1.0),
          row('fedadam@cohort_vec', 0.22, 1.1)]
  targets = bench_cohort.targets(rows, bench_rounds.TFF_REFERENCE)
  assert targets['best_fedavg_cohort'] == 'fedavg@cohort_vec'
  assert targets['best_fedavg_cohort_over_raw'] == pytest.approx(0.4)
  assert targets['tff_fedavg_over_best_cohort'] == pytest.approx(40.0)
  assert targets['adaptive_over_fedavg_cohort'] == {'fedadam@cohort_vec': 1.1}
  entry = bench_sections.scaling_entry('mlp', 10, dict(rows[2], data='arrays', raw_s=0.5,
                                                       raw_pipeline_s=0.6, ratio_to_raw_pipeline=0.3,
                                                       first_round_s=3.0, update_max_abs_diff=2e-9),
                                       0.5)
  assert entry['update_max_abs_diff'] == 2e-9 and set(entry) == set(bench_sections.SCALING_COLUMNS)
  # pylint: disable=protected-access
  assert bench_results._cell(2e-9) == '2.0e-09' and bench_results._cell(0.25) == '0.25'


def test_personalised_rows_carry_test_batches_and_private_state():
  """MTFL's clients take both (test batches for their UA, private batch-norm
  patches): the per-client and cohort rows run the same round. (Per-FedAvg's
  and pFedMe's take the test batches the same way; the personalised
  algorithms' cohort rounds equal their per-client ones in their own tests.)"""
  for name, model in (('mtfl', 'mlp_bn'),):
    setting = bench_rounds.Setting(model, clients=2, steps=1, batch=4)
    runners, skipped, failed = bench_sections.build_cohort_runners(
        setting, [name], ['cohort_vec'], {})
    assert skipped == {} and failed == {}
    runner = runners[f'{name}@cohort_vec/{bench_cohort.DATA}']
    diff, scale = bench_cohort.update_difference(runner.reference, runner)
    assert scale > 1e-4 and diff <= 1e-5, (name, diff, scale)


def test_algorithms_without_a_cohort_form_are_named_not_run(monkeypatch):
  from workflow.flags import algorithms  # pylint: disable=g-import-not-at-top
  setting = bench_rounds.Setting('mlp', clients=2, steps=1, batch=2)
  # Every registered algorithm has one now; an entry registered without one (a
  # user's algorithm) is a row named with its reason, not a failure.
  monkeypatch.setitem(algorithms.ALGORITHMS, 'per_client_only', algorithms.AlgorithmEntry(
      'build_fedavg', cohort=algorithms.No('its clients call a service')))
  process, reason = bench_cohort.build('per_client_only', setting.task(), None,
                                             'cohort_vec')
  assert process is None and reason == 'its clients call a service'
  specs = bench_cohort.row_specs(['fedadam', 'tff_fedavg', 'mimelite', 'fedprox', 'fedavg'],
                                       ['cohort_vec', 'cohort_vec_cpp'], bench_rounds.ALGORITHMS)
  assert [s[0] for s in specs] == ['fedadam@cohort_vec', 'mimelite@cohort_vec',
                                   'fedprox@cohort_vec', 'fedavg@cohort_vec',
                                   'fedavg@cohort_vec_cpp']


@pytest.mark.parametrize('model', ['so_lr', 'gru'])
def test_so_lr_and_gru_models_and_their_raw_loops(model):
  setting = bench_rounds.Setting(model, clients=2, steps=1, batch=2)
  x, y = setting.client_tensors(0)
  spec = bench_rounds.MODELS[model]
  assert x.shape == (2,) + spec.x_shape and y.shape == (2,) + spec.y_shape
  if model == 'so_lr':  # a normalised bag of words, multi-hot tags
    assert float(tf.reduce_max(tf.abs(tf.reduce_sum(x, 1) - 1.0))) < 1e-5
    assert set(y.numpy().ravel()) <= {0.0, 1.0}
  else:  # tokens, never padding
    assert int(tf.reduce_min(x)) >= 1 and int(tf.reduce_max(x)) < spec.classes
  assert math.isfinite(float(bench_rounds.build_raw(setting)()))
  assert bench_rounds.SETTINGS[model][0] == model


@pytest.mark.parametrize('flag', ['--out={missing}', '--modes=together'])
def test_population_bench_refuses_bad_flags_before_running(tmp_path, flag):
  import subprocess  # pylint: disable=g-import-not-at-top
  script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bench',
                        'population.py')
  done = subprocess.run([sys.executable, script, flag.format(missing=tmp_path / 'missing')],
                        capture_output=True, text=True, timeout=60, check=False)
  assert done.returncode == 2 and 'Traceback' not in done.stderr
  assert done.stderr.splitlines()[-1].startswith(f'population.py: error: {flag.split("=")[0]}')
  assert not os.listdir(tmp_path)
