"""Tables, notes and figures of reports/shakespeare.md (shakespeare_markdown.py
writes the text around them). Every number is read from the runs' metrics.csv."""

import math

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

import report_runner as rr  # pylint: disable=g-import-not-at-top
import shakespeare_curves as sc  # pylint: disable=g-import-not-at-top
import shakespeare_verdicts as sv  # pylint: disable=g-import-not-at-top
from workflow.reporting import plotting  # pylint: disable=g-import-not-at-top

STEPS = 'cost/cumulative_client_steps'


def fmt(value, digits=3):
  return '–' if value is None or math.isnan(value) else f'{value:.{digits}f}'


def training_minutes(columns):
  return sum(v for v in columns.get('round_seconds', []) if not math.isnan(v)) / 60


def last_loss(columns):
  """Mean training loss of the last LOSS_WINDOW rounds (what the plateau rule reads)."""
  values = [v for _, v in rr.points(columns, 'round', sv.LOSS)][-sv.LOSS_WINDOW:]
  return sum(values) / len(values) if values else math.nan


def claim_rows(claims, head='claim (the paper\'s words)', verdicts=('verdict',)):
  """A table of (claim, check, one verdict per heading of `verdicts`) rows."""
  heads = [head, 'our check', *verdicts]
  rows = ['| ' + ' | '.join(heads) + ' |', '|' + '---|' * len(heads)]
  return rows + ['| ' + ' | '.join(claim) + ' |' for claim in claims]


def plot_panels(curves, title, panels, out):
  """One panel per (metric, axis label, scale) of `panels`: the metric by round
  of each finished run of {legend label: job}."""
  done = {label: rr.read_columns(job) for label, job in curves.items() if rr.finished(job)}
  if not done:
    return False
  fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 4.5), squeeze=False)
  for ax, (metric, ylabel, scale) in zip(axes[0], panels):
    for label, columns in done.items():
      xs, ys = zip(*rr.points(columns, 'round', metric))
      ax.plot(xs, [scale * y for y in ys], label=label)
    ax.set_xlabel('communication round')
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=7)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return True


def plot_curves(part_jobs, configs, title, out):
  curves = {label: part_jobs[(name, 0)] for name, (label, _) in configs.items()
            if (name, 0) in part_jobs}
  return plot_panels(curves, title, [
      (sv.ACCURACY, f'validation accuracy (%), every {sc.EVAL_STRIDE}th test sequence', 100),
      (sv.LOSS, 'training loss of the round\'s client steps', 1)], out)


def config_rows(part_jobs, configs, extra=None):
  """One row per configuration: seeds finished, curve measures (mean over seeds)."""
  head = ['configuration', 'seeds finished', 'mean validation accuracy over the run',
          'highest validation accuracy', 'lowest training loss',
          f'training loss, last {sv.LOSS_WINDOW} rounds', 'training time per run (min)',
          'wall-clock per run (min)', 'CPU per run (core-min)']
  if extra:
    head.append(extra[0])
  rows = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for name, (label, _) in configs.items():
    done = [j for (n, _), j in part_jobs.items() if n == name and rr.finished(j)]
    cols = [rr.read_columns(j) for j in done]
    mean = lambda f: sum(map(f, cols)) / len(cols) if cols else math.nan
    cells = [label, f'{len(done)} of {sum(n == name for n, _ in part_jobs)}',
             fmt(mean(sc.mean_accuracy)), fmt(mean(sc.max_accuracy)),
             fmt(mean(sc.min_train_loss)), fmt(mean(last_loss)),
             fmt(mean(training_minutes), 1), wall_cell(done), cpu_cell(done)]
    if extra:
      cells.append(extra[1](name, cols))
    rows.append('| ' + ' | '.join(cells) + ' |')
  return rows


def logged_mean_cell(jobs, minutes_of) -> str:
  """Mean over the runs of `minutes_of(job)` (None: not logged), noting how
  many of them logged it: the wall-clock and CPU columns."""
  values = [v for v in map(minutes_of, jobs) if v is not None]
  if not values:
    return '–'
  note = '' if len(values) == len(jobs) else f' ({len(values)} of {len(jobs)} logged)'
  return f'{sum(values) / len(values):.1f}{note}'


def wall_cell(jobs) -> str:
  """Mean wall-clock minutes per whole run (`report_runner.seconds_per_run`)."""
  return logged_mean_cell(jobs, lambda job: _minutes(rr.seconds_per_run(job, 'wall_seconds')))


def cpu_cell(jobs) -> str:
  """Mean CPU minutes per whole run (`report_runner.seconds_per_run`)."""
  return logged_mean_cell(jobs, lambda job: _minutes(rr.seconds_per_run(job, 'cpu_seconds')))


def _minutes(seconds):
  return None if seconds is None else seconds / 60


def commands(part_jobs):
  return ['<details><summary>commands</summary>', '', '```sh',
          *[rr.command_line(j) for j in part_jobs.values()], '```', '', '</details>', '']


def on_plateau(part_jobs, configs, metric, any_seed=False):
  """The configurations of `configs` none of whose finished runs left the
  plateau on `metric` (shakespeare_verdicts.left_plateau), in order; with
  `any_seed`, those with at least one run still on it."""
  flat = []
  for name in configs:
    stuck = [not sv.left_plateau(c, metric, sc.baselines())
             for c in sc.runs(part_jobs, name).values()]
    if stuck and (any(stuck) if any_seed else all(stuck)):
      flat.append(name)
  return flat


def never_rose(part_jobs, configs):
  """The configurations whose validation accuracy never rose more than
  ACCURACY_PLATEAU above its first evaluation in any finished seed."""
  names = []
  for name in configs:
    evals = [[v for _, v in rr.points(c, 'round', sv.ACCURACY)]
             for c in sc.runs(part_jobs, name).values()]
    if evals and all(e and max(e) - e[0] <= sv.ACCURACY_PLATEAU for e in evals):
      names.append(name)
  return names


def plateau_note(part_jobs, configs):
  """Which configurations are still on their plateau, by each rule."""
  lines = []
  for metric in (sv.ACCURACY, sv.LOSS):
    flat = on_plateau(part_jobs, configs, metric)
    if flat:
      names = ', '.join(sc.short_label(n, configs) for n in flat)
      lines.append(f'{names}: {sv.plateau_text(metric, sc.baselines())} in every seed')
  if not lines:
    return []
  return ['**Still on the plateau.** ' + '; '.join(lines) + '. Any comparison with '
          'them on that curve gets "no verdict (plateau)".', '']


def span(values, scale=1, digits=2):
  """'a–b' of the values (one value when they agree to the digits shown)."""
  low, high = (f'{scale * v:.{digits}f}' for v in (min(values), max(values)))
  return low if low == high else f'{low}–{high}'


def falling_note(part_jobs, configs):
  """The configurations whose last evaluation fell more than ACCURACY_PLATEAU
  below their first in some finished seed, with those curves' ends (and the
  other seeds', which did not fall)."""
  lines = []
  for name in configs:
    by_seed = sc.runs(part_jobs, name)
    evals = {seed: [v for _, v in rr.points(c, 'round', sv.ACCURACY)]
             for seed, c in by_seed.items()}
    fell = [seed for seed, e in evals.items() if e and e[0] - e[-1] > sv.ACCURACY_PLATEAU]
    if not fell:
      continue
    runs, falls = [by_seed[seed] for seed in fell], [evals[seed] for seed in fell]
    last = int(rr.points(runs[0], 'round', sv.ACCURACY)[-1][0])
    lines.append(
        f'**{sc.short_label(name, configs)} falls{_which_seeds(fell, by_seed)}.** Its '
        f'validation accuracy drops from {span([e[-2] for e in falls], 100, 1)} % to '
        f'{span([e[-1] for e in falls], 100, 1)} % at round {last}, while its training loss '
        f'rises from its lowest, {span([sc.min_train_loss(c) for c in runs])}, to '
        f'{span([c[sv.LOSS][-1] for c in runs])} at round {last}: a verdict on its accuracy '
        'that holds only with that last evaluation is flagged in the table below.'
        + _divergence_rule_sentence([part_jobs[(name, seed)] for seed in fell], runs)
        + _other_seeds(fell, by_seed, evals, last))
  return [line for text in lines for line in (text, '')]


def _which_seeds(fell, by_seed):
  if len(by_seed) == 1:
    return ' in its one finished seed'
  if len(fell) == len(by_seed):
    return f' in all {len(by_seed)} seeds'
  return f' in seed {", ".join(map(str, fell))} of {len(by_seed)} finished seeds'


def _other_seeds(fell, by_seed, evals, last):
  """What the configuration's seeds that did not fall end at."""
  others = [seed for seed in by_seed if seed not in fell]
  if not others:
    return ''
  return (f' Seed {", ".join(map(str, others))} does not fall: its validation accuracy '
          f'ends at {span([evals[s][-1] for s in others], 100, 1)} % and its training loss at '
          f'{span([by_seed[s][sv.LOSS][-1] for s in others])} at round {last}: at these settings '
          'the configuration trains in some seeds and comes apart in others.')


def _divergence_rule_sentence(jobs, runs):
  """Why bin/train's divergence rule did not stop these finished runs (`jobs`,
  their metrics.csv columns `runs`), from each run's flags.json ('' when a run
  has none).

  The rule stops a run after --divergence_rounds rounds in a row above
  --divergence_factor x the initial model's loss. That loss is not in
  metrics.csv; the uniform guess's ln V stands for it (an untrained model's loss
  is about ln V)."""
  flags = [plotting.read_flags(rr.run_dir(job)) for job in jobs]
  if not flags or None in flags:
    return ''
  settings = {(f['divergence_factor'], f['divergence_rounds']) for f in flags}
  if len(settings) != 1 or not next(iter(settings))[0]:
    return ''  # runs under different rules, or the rule turned off
  factor, rounds = settings.pop()
  limit = factor * math.log(sc.VOCAB_SIZE)
  peaks, longest = [], 0
  for columns in runs:
    points = rr.points(columns, 'round', sv.LOSS)
    peaks.append(max(points, key=lambda p: p[1]))
    streak = 0
    for _, loss in points:
      streak = streak + 1 if loss > limit else 0
      longest = max(longest, streak)
  where = ', '.join(f'{loss:.2f} at round {int(r)}' for r, loss in peaks)
  return (f' Its training loss peaks at {where}. bin/train\'s divergence rule stops a run after '
          f'{rounds} rounds in a row above {factor:g} × the initial model\'s loss (about '
          f'{limit:.1f} = {factor:g} × ln {sc.VOCAB_SIZE}); this loss stayed above {limit:.1f} '
          f'for at most {longest} rounds in a row, so the rule let the run go on.')
