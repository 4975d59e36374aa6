"""Metric curves from bin/train's metrics.csv files, labelled in words.

Axes read words with units instead of metrics.csv keys (`metric_label`), the
title names the task and the settings all runs share, each legend entry the
algorithm and the settings in which its run differs from the others (read
from the runs' flags.json), and round axes have integer ticks.
"""

import csv
import json
import math
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib import ticker  # pylint: disable=g-import-not-at-top
from workflow.training import experiment

# metrics.csv column (exact) -> words with units.
EXACT_LABELS = {
    'round': 'round',
    'eval/accuracy': 'test accuracy',
    'eval/loss': 'test loss',
    'eval/recall_at_5': 'test recall@5',
    'eval/mse': 'test mean squared error',
    'round_seconds': 'wall time per round (s)',
    'eval_seconds': 'wall time per evaluation (s)',
    'sim/round_seconds': 'simulated time per round (s)',
    'sim/cumulative_minutes': 'simulated time (minutes)',
    'dp/epsilon': 'privacy budget ε spent',
    'dp/delta': 'privacy δ',
    'schedule/client_learning_rate': 'client learning rate η',
    'schedule/server_learning_rate': 'server learning rate η_s',
    'schedule/local_steps': 'local steps K',
    'ua/mean': 'user accuracy, mean over clients',
    'ua/min': 'user accuracy, worst client',
    'ua/max': 'user accuracy, best client',
    'ua_all/mean': 'user accuracy incl. noisy clients, mean',
    'client_drift/delta_cosine_distance': 'client drift: cosine distance of updates',
    'client_drift/model_cosine_distance': 'client drift: cosine distance of models',
    'train/first_minibatch_loss': 'training loss, first minibatch',
}
# Cost columns `cost/[cumulative_]<name>`: <name> -> (words, unit).
COST_LABELS = {
    'upload_bits': ('upload, all clients', 'bits'),
    'download_bits': ('download, all clients', 'bits'),
    'upload_bits_per_client': ('upload per client', 'bits'),
    'download_bits_per_client': ('download per client', 'bits'),
    'client_flops': ('client compute, all clients', 'FLOPs'),
    'client_flops_per_client': ('client compute per client', 'FLOPs'),
    'client_steps': ('client steps, all clients', 'minibatch steps'),
    'client_optimizer_state_floats': ('client optimiser state', 'floats'),
}
# Suffixes of training metrics (any prefix: TFF's `client_work/train/`, the
# learning algorithm's own, or other names TFF's state layout (LearningAlgorithmState) gives them).
TRAIN_SUFFIXES = {
    'loss': 'training loss (sampled clients)',
    'sparse_categorical_accuracy': 'training accuracy (sampled clients)',
    'accuracy': 'training accuracy (sampled clients)',
    'num_examples': 'training examples per round',
    'num_batches': 'training minibatches per round',
    'first_minibatch_loss': 'training loss, first minibatch',
    'delta_cosine_distance': 'client drift: cosine distance of updates',
    'model_cosine_distance': 'client drift: cosine distance of models',
}


def metric_label(key: str) -> str:
  """Words (with the unit) for a metrics.csv column; unknown keys read as their last part."""
  if key in EXACT_LABELS:
    return EXACT_LABELS[key]
  match = re.fullmatch(r'cost/(cumulative_)?(\w+)', key)
  if match and match.group(2) in COST_LABELS:
    words, unit = COST_LABELS[match.group(2)]
    if match.group(1):
      return f'cumulative {words} ({unit})'
    return f'{words} per round ({unit})'
  if key.startswith('train/'):
    last = key.rsplit('/', 1)[-1]
    if last in TRAIN_SUFFIXES:
      return TRAIN_SUFFIXES[last]
  if key.startswith('eval/'):
    return 'test ' + key[len('eval/'):].replace('_', ' ')
  return key.rsplit('/', 1)[-1].replace('_', ' ')


def read_metrics(run: str) -> dict[str, list[float]]:
  """Columns of a run's metrics.csv (empty cells → NaN)."""
  path = run if run.endswith('.csv') else os.path.join(run, 'metrics.csv')
  if not os.path.exists(path):
    raise ValueError(f'--runs: no metrics file at {path}')
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  columns = {}
  for name in (rows[0].keys() if rows else ()):
    columns[name] = [float(r[name]) if r.get(name) not in (None, '') else math.nan for r in rows]
  return columns


def read_flags(run: str) -> Optional[dict[str, Any]]:
  """A run's flags.json (None for a bare CSV or a run without one)."""
  path = os.path.join(os.path.dirname(run) if run.endswith('.csv') else run, 'flags.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _value(value: Any) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, float):
    return f'{value:g}'
  return str(value)


def describe_runs(flag_sets: Sequence[Optional[Mapping[str, Any]]]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """(settings every run shares, each run's own settings) of the runs' flags.json.

  Only flags that change the computation count (not the loop, output or
  execution flags of `experiment.NOT_IN_NAME`; the task and algorithm do). A flag's
  default is its algorithm's default where it has one, else bin/train's.
  Shared: equal in every run and not a default. Own: differing between runs,
  unless every run has its own default (FedAdam's server lr beside FedAvg's).
  """
  from workflow.flags import algorithms  # pylint: disable=g-import-not-at-top
  from workflow.flags import config  # pylint: disable=g-import-not-at-top
  from workflow.flags import train_flags  # pylint: disable=g-import-not-at-top
  known = [f for f in flag_sets if f is not None]
  if not known:
    return {}, [{} for _ in flag_sets]
  # flags.json of an older run may hold flags bin/train no longer has: left out of its settings.
  defaults = [{**train_flags.DEFAULTS, **algorithms.algorithm_defaults(config.from_flags(
      {k: v for k, v in f.items() if k in train_flags.TRAIN_FLAG_NAMES}))}
              for f in known]
  missing = object()
  ignored = experiment.NOT_IN_NAME - {'algorithm', 'task'}
  keys = [k for k in train_flags.FLAGS_BY_NAME if k not in ignored and any(k in f for f in known)]
  varying = [k for k in keys if len({json.dumps(f.get(k)) for f in known}) > 1]
  own_keys = [k for k in varying if k == 'algorithm' or any(
      f.get(k, missing) != d.get(k, missing) for f, d in zip(known, defaults))]
  shared = {k: known[0][k] for k in keys if k not in varying and k in known[0] and (
      k in ('task', 'algorithm') or known[0][k] != defaults[0].get(k, missing))}
  own = [{k: f.get(k) for k in own_keys} if f is not None else {} for f in flag_sets]
  return shared, own


def legend_label(own: Mapping[str, Any], shared: Mapping[str, Any]) -> str:
  """`fedadam, server_learning_rate=0.01`: the algorithm and the run's own settings."""
  algorithm = own.get('algorithm', shared.get('algorithm', ''))
  rest = [f'{k}={_value(v)}' for k, v in own.items() if k not in ('algorithm',)]
  return ', '.join([str(algorithm)] + rest) if algorithm else ', '.join(rest)


def default_title(shared: Mapping[str, Any], max_settings: int = 6) -> str:
  """`digits: num_clients=20, client_learning_rate=0.05, …` (the task and the shared settings)."""
  task = shared.get('task')
  settings = [f'{k}={_value(v)}' for k, v in shared.items() if k not in ('task', 'algorithm')]
  if 'algorithm' in shared:
    settings.insert(0, str(shared['algorithm']))
  if len(settings) > max_settings:
    settings = settings[:max_settings] + [f'… ({len(settings) - max_settings} more)']
  text = ', '.join(settings)
  return f'{task}: {text}' if task and text else str(task or text)


def integer_ticks(ax, x: str, xs: Sequence[float] = ()) -> None:
  """Rounds are whole numbers: integer ticks, also for a run with one or a few points."""
  if x != 'round':
    return
  xs = [v for v in xs if math.isfinite(v)]
  if xs and max(xs) - min(xs) <= 10:
    first, last = math.floor(min(xs)), math.ceil(max(xs))
    ax.set_xticks(range(first, last + 1))
    ax.set_xlim(first - 0.5, last + 0.5)
  else:
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def plot_runs(runs: Sequence[str], out: str, *, x: str = 'round',
              metrics: Sequence[str] = ('eval/accuracy', 'eval/loss'),
              labels: Optional[Sequence[str]] = None, title: str = '') -> str:
  """One panel per metric, one line per run; returns `out` (a PNG)."""
  fig = plot_runs_figure(runs, x=x, metrics=metrics, labels=labels, title=title)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def plot_runs_figure(runs: Sequence[str], *, x: str = 'round',
                     metrics: Sequence[str] = ('eval/accuracy', 'eval/loss'),
                     labels: Optional[Sequence[str]] = None, title: str = ''):
  """The figure of `plot_runs`, open (tests read its artists)."""
  if not runs:
    raise ValueError('--runs: give at least one experiment directory or CSV')
  if labels and len(labels) != len(runs):
    raise ValueError(f'--labels: {len(labels)} labels for {len(runs)} runs')
  flag_sets = [read_flags(r) for r in runs]
  shared, own = describe_runs(flag_sets)
  if not labels:
    labels = [legend_label(o, shared) if f is not None
              else os.path.basename(os.path.normpath(r.removesuffix('metrics.csv')))
              for r, f, o in zip(runs, flag_sets, own)]
    if len(set(labels)) < len(labels):  # same settings (e.g. reruns elsewhere): say where
      labels = [f'{label} ({os.path.basename(os.path.normpath(r))})'
                for label, r in zip(labels, runs)]
  fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.2), squeeze=False)
  all_x = []
  for run, label in zip(runs, labels):
    cols = read_metrics(run)
    if x not in cols:
      raise ValueError(f'--x: column {x!r} not in {run}; available: {", ".join(sorted(cols))}')
    for ax, metric in zip(axes[0], metrics):
      if metric not in cols:
        raise ValueError(f'--metrics: column {metric!r} not in {run}')
      points = [(a, b) for a, b in zip(cols[x], cols[metric]) if not math.isnan(b)]
      all_x += [p[0] for p in points]
      ax.plot([p[0] for p in points], [p[1] for p in points], marker='o', markersize=3,
              label=label)
  for ax, metric in zip(axes[0], metrics):
    ax.set_xlabel(metric_label(x))
    ax.set_ylabel(metric_label(metric))
    integer_ticks(ax, x, all_x)
    ax.grid(alpha=0.3)
  finish_figure(fig, axes[0][0], title or default_title(shared) or 'metrics')
  return fig


def finish_figure(fig, ax, title: str) -> None:
  """Title on top, one legend for all panels under them (long labels never cover a curve)."""
  handles, labels = ax.get_legend_handles_labels()
  ncol = 1 if max((len(l) for l in labels), default=0) > 45 else min(3, len(labels))
  rows = math.ceil(len(labels) / max(ncol, 1))
  height = fig.get_size_inches()[1]
  title_lines = sum(len(textwrap.wrap(line, 110)) or 1 for line in title.split('\n'))
  fig.suptitle('\n'.join(textwrap.fill(line, 110) for line in title.split('\n')), fontsize=11)
  top = 1 - (0.04 + 0.2 * title_lines) / height
  bottom = (0.15 + 0.2 * rows) / height
  fig.tight_layout(rect=(0, bottom, 1, top))
  fig.legend(handles, labels, loc='lower center', ncol=ncol, fontsize=9, frameon=False)
