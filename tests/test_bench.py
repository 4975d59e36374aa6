"""Smoke test of bench/run.py (issue 10): tiny sizes, schema and finite ratios.

No timing assertion: the machine is shared; only the code path and the JSON
schema are checked.
"""

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))

import run as bench  # pylint: disable=g-import-not-at-top


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


def test_overhead_schema_and_ratios(results):
  out, _ = results
  data = _load(os.path.join(out, 'overhead.json'))
  assert data['schema_version'] == bench.SCHEMA_VERSION
  assert set(data['machine']) >= {'nproc', 'cpu_model', 'memory_gib', 'load_average'}
  assert len(data['load_before']) == 3 and len(data['load_after']) == 3
  rows = {(r['algorithm'], r['data']): r for r in data['rows']}
  assert set(rows) == {('fedavg', 'ids'), ('tff_fedavg', 'ids')}
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
  setting = bench.Setting('linear', clients=2, steps=2, batch=3)
  x, y = setting.client_tensors(1)
  batches = list(setting.client_dataset(1))
  assert len(batches) == 2 and batches[0][0].shape == (3, 60)
  assert (batches[1][1].numpy() == y.numpy()[3:]).all()
  assert (batches[0][0].numpy() == x.numpy()[:3]).all()
  python = setting.python_datasets()
  assert len(python) == 2 and (list(python[1])[0][0].numpy() == x.numpy()[:3]).all()
