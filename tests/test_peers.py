"""bench/peers.py without the peer environments: the dry run's code path and its table.

No timing assertion (the machine is shared). The dry run writes tiny setting
files, runs the raw loop of the first setting in one process of this
environment and renders the JSON and the section; the table and the doc
splicing are also checked on a hand-made result.
"""

import json
import os
import subprocess
import sys
import time

import pytest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'bench'))

import peers  # pylint: disable=g-import-not-at-top

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow


def test_dry_run_writes_json_and_section_without_peer_envs(tmp_path):
  envs = tmp_path / 'no_envs'
  done = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'bench', 'peers.py'), '--dry_run',
       f'--out_dir={tmp_path}', f'--envs_dir={envs}'],
      capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  assert not envs.exists()  # no environment created
  result = json.loads((tmp_path / 'peers.json').read_text())
  assert result['dry_run'] and result['benchmark'] == 'peers' and 'section' not in result
  assert list(result['settings']) == list(peers.SETTINGS)
  assert 'load_average' in result['machine'] and len(result['load_before']) == 3
  mlp = result['settings']['mlp_50x10']['rows']
  raw = mlp['raw_main']
  assert raw['final_loss'] < raw['initial_loss']  # SGD on the same batches lowers the loss
  assert np.isfinite(raw['round_s']) and raw['versions']['tensorflow'].startswith('2.14')
  assert mlp['pfl_fedavg']['error'] == 'dry run: no peer environment'
  assert mlp['fedjax_fedavg']['error'] == 'dry run: no peer environment'
  assert mlp['flower_fedavg']['error'] == mlp['raw_flower']['error'] == (
      'dry run: no peer environment')
  section = (tmp_path / 'peers_section.md').read_text()
  assert peers.BEGIN in section and '**dry run**' in section
  # ours_sequential is a row of the recurrent setting only: '–' elsewhere
  assert "| mlp_50x10 | not run | – | not run | not run | not run |" in section


def _entry(round_s, loss, ratio=None):
  entry = dict(round_s=round_s, initial_loss=2.3, final_loss=loss, versions={}, notes='')
  if ratio is not None:
    entry.update(ratio_to_ours=ratio, loss_rel_diff=abs(loss - 2.0) / 2.0,
                 loss_equal=abs(loss - 2.0) / 2.0 <= 1e-4)
  return entry


def test_table_marks_target_and_loss_and_replaces_the_doc_section(tmp_path):
  setting = dict(rows={'ours_auto': _entry(0.1, 2.0, 1.0), 'pfl_fedavg': _entry(0.15, 2.1, 1.5),
                       'tff_fedavg': {'error': 'exit 1: boom'}},
                 loss_rtol=1e-4, loss_rtol_reason='', load_before=[1.0, 1, 1],
                 load_after=[2.0, 1, 1],
                 target=dict(ours_over_pfl=0.1 / 0.15, met=False))
  result = dict(machine=dict(nproc=2, cpu_model='cpu', memory_gib=1.0), date='d', dry_run=False,
                target=0.5,
                reps=2, rounds=5, warmup=2, load_before=[1, 1, 1], load_after=[2, 2, 2],
                settings={'mlp_50x10': setting}, versions={'main': {'tensorflow': '2.14.1'}})
  text = peers.markdown(result)
  assert '| mlp_50x10 | 0.100 (1.00×) | – |' in text and '0.150 (1.50×)' in text
  assert '| 0.67 | **missed** |' in text
  assert 'tff_fedavg: exit 1: boom' in text and '| failed |' in text
  assert '2.10000 (5.0e-02, **differs**)' in text
  doc = tmp_path / 'performance.md'
  doc.write_text(f'# Perf\n\nintro\n\n{peers.BEGIN}\nold table\n{peers.END}\n\nafter\n')
  peers.update_doc(str(doc), text)
  new = doc.read_text()
  assert 'old table' not in new and text in new
  assert new.startswith('# Perf\n\nintro\n\n') and new.endswith('\n\nafter\n')


def test_update_keeps_other_settings_and_rows_not_rerun(tmp_path):
  old = dict(date='then', settings={
      'mlp_50x10': dict(rows={'ours_auto': _entry(0.1, 2.0, 1.0)}),
      'gru_10x10': dict(rows={'ours_auto': {'error': 'timeout'}, 'pfl_fedavg': _entry(3, 4, 1)})})
  path = tmp_path / 'peers.json'
  path.write_text(json.dumps(old))
  new = dict(date='now', settings={'gru_10x10': dict(rows={
      'pfl_fedavg': _entry(2, 4), 'ours_sequential': _entry(1, 4)})})
  merged = peers._merged(  # pylint: disable=protected-access
      str(path), new, ['pfl_fedavg', 'ours_sequential'])
  assert list(merged['settings']) == ['mlp_50x10', 'gru_10x10']
  assert merged['settings']['mlp_50x10']['date'] == 'then'
  gru = merged['settings']['gru_10x10']
  assert gru['date'] == 'now' and gru['rows']['pfl_fedavg']['round_s'] == 2
  assert gru['rows']['ours_auto'] == {'error': 'timeout', 'from_run': 'then', 'from_commit': None}


def test_a_timed_out_worker_is_killed_with_the_processes_it_started(tmp_path, monkeypatch):
  # Flower's worker starts Ray's head and actors; a timeout must not leave them running.
  child_pid = tmp_path / 'child.pid'
  worker = tmp_path / 'worker.py'
  worker.write_text(
      'import subprocess, sys, time\n'
      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
      f'open({str(child_pid)!r}, "w").write(str(child.pid))\n'
      'time.sleep(120)\n')
  monkeypatch.setattr(peers, 'WORKER', str(worker))
  _, error = peers.run_worker(sys.executable, 'raw', [], str(tmp_path / 'log'), {}, timeout=5)
  assert error.startswith('killed after 5 s')
  pid = int(child_pid.read_text())
  for _ in range(50):  # the orphan is reaped by init a moment after the kill
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      break
    with open(f'/proc/{pid}/stat') as f:
      if f.read().split(')')[-1].split()[0] == 'Z':
        break
    time.sleep(0.1)
  else:
    raise AssertionError(f'the worker\'s child {pid} outlived the timeout')
