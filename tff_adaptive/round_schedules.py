"""Drives the per-round schedules of K, η (client) and η_s (server) in the loop.

One mechanism for every algorithm (SPEC §5): before round t the driver asks
each schedule for its value and writes it where the round will read it —
K_t and η_t into the composer state's `hparams` (broadcast to clients with the
model), η_s into the server optimiser state's `learning_rate`. Processes built
by TFF's own builders (Mimelite, FedProx) get K_t through their data (exactly
K_t batches); they have no broadcast η, so only a constant η works for them.

After the round, feedback-driven schedules observe what they need (the mean
first-minibatch loss, or the validation accuracy). The driver's whole state is
a JSON string saved with every checkpoint, so a resumed run continues the
exact same sequence.

It also keeps seed 001's accounting (client steps against constant K_0) and
the thesis's runtime model (ch. 5): a round lasts download + K_t·β + upload
seconds for the slowest client (all clients equal here).
"""

import collections
import json
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from tff_adaptive import schedules


class ScheduleError(ValueError):
  pass


class RoundSchedules:
  """K_t / η_t / η_s schedules plus step and simulated-time accounting."""

  def __init__(self, *, local_steps: Optional[schedules.Schedule] = None,
               client_lr: Optional[schedules.Schedule] = None,
               server_lr: Optional[schedules.Schedule] = None,
               step_seconds: float = 0.0, down_mbps: float = schedules.DEFAULT_DOWN_MBPS,
               up_mbps: float = schedules.DEFAULT_UP_MBPS):
    self.local_steps, self.client_lr, self.server_lr = local_steps, client_lr, server_lr
    self.step_seconds, self.down_mbps, self.up_mbps = step_seconds, down_mbps, up_mbps
    self.steps_total = 0.0
    self.constant_k_steps_total = 0.0
    self.sim_seconds_total = 0.0

  def _all(self):
    return {'local_steps': self.local_steps, 'client_lr': self.client_lr,
            'server_lr': self.server_lr}

  # ---- before a round ----
  def apply(self, state: Any, round_num: int) -> tuple[Any, Optional[int], dict[str, float]]:
    """Returns (state for round `round_num` (1-based), K for the data, metrics)."""
    t = round_num - 1
    row = {}
    k = None if self.local_steps is None else int(self.local_steps.value(t))
    lr = None if self.client_lr is None else float(self.client_lr.value(t))
    server_lr = None if self.server_lr is None else float(self.server_lr.value(t))
    composed = isinstance(state, Mapping) and 'hparams' in state
    if composed:
      state = collections.OrderedDict(state)
      hparams = collections.OrderedDict(state['hparams'])
      if k is not None:
        hparams['local_steps'] = np.int32(k)
      if lr is not None:
        hparams['client_learning_rate'] = np.float32(lr)
      state['hparams'] = hparams
      if server_lr is not None:
        stats = state['stats']
        if not (isinstance(stats, Mapping) and 'learning_rate' in stats):
          raise ScheduleError('--server_lr_schedule: this algorithm has no server learning rate')
        stats = collections.OrderedDict(stats)
        stats['learning_rate'] = np.asarray(server_lr, np.asarray(stats['learning_rate']).dtype)
        state['stats'] = stats
    elif lr is not None or server_lr is not None:
      raise ScheduleError('--client_lr_schedule/--server_lr_schedule need an algorithm built by '
                          'the package composer (not mimelite/fedprox)')
    for name, value in (('local_steps', k), ('client_learning_rate', lr),
                        ('server_learning_rate', server_lr)):
      if value is not None:
        row[f'schedule/{name}'] = float(value)
    return state, (None if composed else k), row

  # ---- after a round ----
  def observe(self, round_num: int, row: Mapping[str, float], num_clients: int) -> dict[str, float]:
    """Feeds feedback schedules; returns accounting metrics for the round."""
    t = round_num - 1
    for schedule in self._all().values():
      if schedule is None or schedule.feedback is None:
        continue
      if schedule.feedback == schedules.FEEDBACK_FIRST_MINIBATCH_LOSS:
        schedule.observe(t, float(row.get('train/first_minibatch_loss', float('nan'))))
      elif 'eval/accuracy' in row:
        schedule.observe(t, float(row['eval/accuracy']))
    out = {}
    steps = float(row.get('cost/client_steps', 0.0))
    self.steps_total += steps
    if self.local_steps is not None:
      self.constant_k_steps_total += num_clients * self.local_steps.base
      out['schedule/step_fraction_vs_constant_k0'] = (
          self.steps_total / max(self.constant_k_steps_total, 1.0))
    k = row.get('schedule/local_steps', steps / max(num_clients, 1))
    round_seconds = (row.get('cost/download_bits_per_client', 0.0) / 1e6 / self.down_mbps +
                     k * self.step_seconds +
                     row.get('cost/upload_bits_per_client', 0.0) / 1e6 / self.up_mbps)
    self.sim_seconds_total += round_seconds
    out['sim/round_seconds'] = round_seconds
    out['sim/cumulative_minutes'] = self.sim_seconds_total / 60.0
    return out

  # ---- checkpointing ----
  def to_json(self) -> str:
    return json.dumps({
        'schedules': {k: (None if s is None else s.state()) for k, s in self._all().items()},
        'steps_total': self.steps_total, 'constant_k_steps_total': self.constant_k_steps_total,
        'sim_seconds_total': self.sim_seconds_total})

  def restore(self, text: str) -> None:
    saved = json.loads(text)
    for name, state in saved['schedules'].items():
      setattr(self, name, None if state is None else schedules.schedule_from_state(state))
    self.steps_total = saved['steps_total']
    self.constant_k_steps_total = saved['constant_k_steps_total']
    self.sim_seconds_total = saved['sim_seconds_total']


def from_config(cfg: Mapping[str, Any]) -> RoundSchedules:
  """Builds the driver from bin/train flags; ValueError names the bad flag."""
  total = cfg.get('total_rounds')
  shared = dict(window=cfg.get('schedule_window'), patience=cfg.get('plateau_patience'),
                min_delta=cfg.get('plateau_min_delta'))

  def only(keys):
    return {k: v for k, v in shared.items() if k in keys}

  feedback_params = {'error': ('window',), 'step': ('patience', 'min_delta')}

  local = None
  k_name = cfg.get('local_steps_schedule') or 'constant'
  if cfg.get('local_steps'):
    local = schedules.make_local_steps_schedule(
        k_name, cfg['local_steps'], decay=cfg.get('local_steps_decay'),
        b=cfg.get('local_steps_theory_b'), total_rounds=total,
        **only(feedback_params.get(k_name, ())))
  elif k_name != 'constant':
    raise ScheduleError(f'--local_steps_schedule={k_name} needs --local_steps (K_0)')
  lrs = {}
  for prefix in ('client', 'server'):
    name = cfg.get(f'{prefix}_lr_schedule') or 'constant'
    if name == 'constant' and not cfg.get(f'{prefix}_lr_warmup_rounds'):
      lrs[prefix] = None
      continue
    lrs[prefix] = schedules.make_lr_schedule(
        name, cfg[f'{prefix}_learning_rate'], decay_rate=cfg.get(f'{prefix}_lr_decay_rate'),
        decay_steps=cfg.get(f'{prefix}_lr_decay_steps'),
        staircase=cfg.get(f'{prefix}_lr_staircase'),
        warmup_rounds=cfg.get(f'{prefix}_lr_warmup_rounds'), total_rounds=total,
        flag_prefix=prefix,
        **only(feedback_params.get(name, ())))
  return RoundSchedules(local_steps=local, client_lr=lrs['client'], server_lr=lrs['server'],
                        step_seconds=cfg.get('step_time_seconds') or 0.0,
                        down_mbps=cfg.get('download_mbps') or schedules.DEFAULT_DOWN_MBPS,
                        up_mbps=cfg.get('upload_mbps') or schedules.DEFAULT_UP_MBPS)
