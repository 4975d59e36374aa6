"""Metric curves from bin/train's metrics.csv files."""

import csv
import math
import os
from collections.abc import Sequence
from typing import Optional

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top


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


def plot_runs(runs: Sequence[str], out: str, *, x: str = 'round',
              metrics: Sequence[str] = ('eval/accuracy', 'eval/loss'),
              labels: Optional[Sequence[str]] = None, title: str = '') -> str:
  if not runs:
    raise ValueError('--runs: give at least one experiment directory or CSV')
  if labels and len(labels) != len(runs):
    raise ValueError(f'--labels: {len(labels)} labels for {len(runs)} runs')
  labels = labels or [os.path.basename(os.path.normpath(r.removesuffix('metrics.csv'))) for r in runs]
  fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.8), squeeze=False)
  for run, label in zip(runs, labels):
    cols = read_metrics(run)
    if x not in cols:
      raise ValueError(f'--x: column {x!r} not in {run}; available: {", ".join(sorted(cols))}')
    for ax, metric in zip(axes[0], metrics):
      if metric not in cols:
        raise ValueError(f'--metrics: column {metric!r} not in {run}')
      points = [(a, b) for a, b in zip(cols[x], cols[metric]) if not math.isnan(b)]
      ax.plot([p[0] for p in points], [p[1] for p in points], marker='.', label=label)
  for ax, metric in zip(axes[0], metrics):
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out
