"""Drives the per-round schedules of K, η (client) and η_s (server) in the loop.

The decaying-K paper ("Faster Federated Learning with Decaying Number of Local SGD
Steps") and the thesis, ch. 5, docs/algorithms.md#schedules: K_t and the client
learning rate γ_t are server state, broadcast every round; η_s is the server
optimiser's learning rate.

One mechanism for every algorithm: before round t the driver asks each
schedule for its value and writes it into the server state (a
`tff.learning.templates.LearningAlgorithmState`) at a fixed place, which the
round then reads:

  * composer-built processes (FedAvg/FedSGD, the FedOpt family, FedGBO, MFL,
    FedAda2, Mimelite, MimeXlite, FedProx, FedMAX, CE-FedAvg) and the
    personalised ones: K_t and
    γ_t into `state.client_work` (`local_steps`, `learning_rate`), broadcast
    to clients with the model (FedGBO's server inverse step reads the same
    K_t and γ_t); η_s into the server optimiser state,
    `state.finalizer['learning_rate']` (Mimelite, MimeXlite:
    `state.finalizer['server']['learning_rate']`). FedGBO, MFL and CE-FedAvg
    have no server learning rate (x ← x − Δ̄).
  * processes built by TFF's own builders (e.g. TFF's Mime Lite, FedProx,
    FedAvg): K_t through the data (each client gets exactly K_t batches,
    `program.client_datasets`), η_s into `state.finalizer['learning_rate']`,
    γ_t into TFF's Mime Lite's client optimiser state
    (`state.client_work[0]['learning_rate']`; TFF's FedProx keeps its client
    learning rate inside the computation, so it cannot be scheduled).

These are the fields that `process.get_hparams` / `set_hparams` expose
(`client_work` and `finalizer`, TFF's hparams layout). The driver writes them
in Python instead of calling `set_hparams`: a TFF call would carry the whole
state (model and optimiser statistics) through the executor and back every
round for two scalars.

`check_process` finds those places in the process's state type before
training, so an impossible combination is a `ScheduleError` naming the
schedule (`local_steps`, `client_lr`, `server_lr`) before training, not a
failure at round 1. Building the schedules from bin/train's flags is
`workflow/flags/schedule_flags.py`'s.

After the round, feedback-driven schedules observe what they need: the mean
loss that the sampled clients report on their FIRST local minibatch
(`train/client_work/first_minibatch_loss`, which composer-built processes
report), or the
validation accuracy on the loop's regular evaluation rounds only. The
driver's whole state is a JSON string saved with every checkpoint, so a
resumed run continues the exact same sequence.

It also keeps the decaying-K paper's accounting (client steps against constant K_0) and
the thesis's runtime model (eqs. 5.3-5.5): a round lasts, for the slowest
client, download + K_t·β + upload seconds, with the per-client bits that the
process itself measured from the real model.
"""

import collections
import json
import math
from collections.abc import Mapping
from typing import Any, Optional, Union

import numpy as np

from tff_adaptive import errors
from tff_adaptive.accounting import runtime_model
from tff_adaptive.schedules import core as schedules

# Where each scheduled quantity lives in a process's server state, in order of
# preference. A path is a sequence of field names (str) and positions (int).
Path = tuple[Union[str, int], ...]
LOCAL_STEPS_PATHS: tuple[Path, ...] = (('client_work', 'local_steps'),)
CLIENT_LR_PATHS: tuple[Path, ...] = (
    ('client_work', 'learning_rate'),  # composer
    ('client_work', 0, 'learning_rate'),  # TFF's Mimelite: the base optimiser's state
)
SERVER_LR_PATHS: tuple[Path, ...] = (
    # Composer (server optimiser state: FedOpt, FedProx, FedAda2, FedMAX) and
    # TFF's builders.
    ('finalizer', 'learning_rate'),
    ('finalizer', 'server', 'learning_rate'),  # Mime, personalised processes
)
FIRST_MINIBATCH_LOSS = 'train/client_work/first_minibatch_loss'
# The step schedules watch validation accuracy; tasks without one (the EMNIST
# autoencoder, StackOverflow tags) are watched through −eval/loss instead.
VALIDATION_ACCURACY = 'eval/accuracy'
VALIDATION_LOSS = 'eval/loss'


class ScheduleError(errors.ArgumentError):
  """A schedule the process cannot follow; the message starts with the schedule's name.

  The name is `RoundSchedules`' argument (the error's owner): `local_steps`,
  `client_lr` or `server_lr`, with its tag as `value` (`local_steps=exp: ...`);
  `errors.Given` names it again, or `check_process`'s `data_on_workers`.
  """

  def __init__(self, argument: str, *detail: errors.Piece, value: Any = None):
    super().__init__('RoundSchedules', argument, *detail, value=value)

  def _pieces(self) -> tuple[errors.Piece, ...]:
    return (errors.Given(self.value, quoted=False),) + self.detail

  def _message(self) -> str:
    return self.worded(lambda argument, value: None)


# ---- finding and replacing a scalar inside a (type of a) server state ----

def _type_child(type_spec, key):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  if not isinstance(type_spec, tff.StructType):
    return None
  elements = list(tff.structure.iter_elements(type_spec))
  if isinstance(key, int):
    return elements[key][1] if key < len(elements) else None
  return next((member for name, member in elements if name == key), None)


def _type_has_scalar(type_spec, path: Path) -> bool:
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  for key in path:
    type_spec = _type_child(type_spec, key)
    if type_spec is None:
      return False
  return isinstance(type_spec, tff.TensorType) and not type_spec.shape


def _child(structure, key):
  if isinstance(key, int):
    return structure[key] if isinstance(structure, (list, tuple)) and key < len(structure) else None
  if isinstance(structure, Mapping):
    return structure.get(key)
  return getattr(structure, key, None) if hasattr(structure, '_fields') else None


def _get(structure, path: Path):
  for key in path:
    structure = _child(structure, key)
    if structure is None:
      return None
  return structure if np.ndim(structure) == 0 else None


def _replace(structure, path: Path, value):
  """A copy of `structure` with the scalar at `path` replaced, dtype kept."""
  key, rest = path[0], path[1:]
  old = _child(structure, key)
  new = _replace(old, rest, value) if rest else np.asarray(value, np.asarray(old).dtype)[()]
  if isinstance(key, int):
    items = list(structure)
    items[key] = new
    return items if isinstance(structure, list) else type(structure)(items)
  if isinstance(structure, Mapping):
    copy = collections.OrderedDict(structure) if isinstance(
        structure, collections.OrderedDict) else dict(structure)
    copy[key] = new
    return copy
  return structure._replace(**{key: new})  # a NamedTuple (TFF's LearningAlgorithmState)


def _first(paths, has) -> Optional[Path]:
  return next((p for p in paths if has(p)), None)


class RoundSchedules:
  """K_t / η_t / η_s schedules plus step and simulated-time accounting."""

  def __init__(self, *, local_steps: Optional[schedules.Schedule] = None,
               client_lr: Optional[schedules.Schedule] = None,
               server_lr: Optional[schedules.Schedule] = None,
               step_seconds: float = 0.0, down_mbps: float = runtime_model.DEFAULT_DOWN_MBPS,
               up_mbps: float = runtime_model.DEFAULT_UP_MBPS,
               rounds_per_eval: Optional[int] = None):
    """Args:
      local_steps, client_lr, server_lr: the schedules (None: not scheduled).
      step_seconds: β, compute seconds per minibatch step (runtime model).
      down_mbps, up_mbps: client bandwidths D and U in Mbit/s.
      rounds_per_eval: the loop's regular evaluation period. Step schedules
        only observe evaluations on rounds that are multiples of it, not the
        extra evaluation the loop makes after its last round, so a run cut in
        two and resumed sees the same evaluations as one uninterrupted run.
        None: every evaluation counts.
    """
    self.local_steps, self.client_lr, self.server_lr = local_steps, client_lr, server_lr
    self.step_seconds, self.down_mbps, self.up_mbps = step_seconds, down_mbps, up_mbps
    self.rounds_per_eval = rounds_per_eval
    self.steps_total = 0.0
    self.constant_k_steps_total = 0.0
    self.sim_seconds_total = 0.0

  def _all(self) -> dict[str, Optional[schedules.Schedule]]:
    return {'local_steps': self.local_steps, 'client_lr': self.client_lr,
            'server_lr': self.server_lr}

  @property
  def needs_first_minibatch_loss(self) -> bool:
    return any(s is not None and s.feedback == schedules.FEEDBACK_FIRST_MINIBATCH_LOSS
               for s in self._all().values())

  # ---- before training ----
  def check_process(self, process, *, data_on_workers: bool = False) -> None:
    """Raises ScheduleError (naming the schedule) if `process` cannot follow the schedules.

    Args:
      process: the `tff.learning.templates.LearningProcess` to be trained.
      data_on_workers: client datasets are built on workers with a K fixed at
        build time (`data_on_workers.compose_data_on_workers`).
    """
    state_type = process.initialize.type_signature.result
    state_type = getattr(state_type, 'member', state_type)
    has = lambda p: _type_has_scalar(state_type, p)
    if self.local_steps is not None and not _first(LOCAL_STEPS_PATHS, has):
      if data_on_workers and not isinstance(self.local_steps, schedules.ConstantSchedule):
        raise ScheduleError(
            'local_steps', ': with ', errors.Given(argument='data_on_workers'),
            ' this algorithm gets a K fixed when the data computation is built; use a constant K '
            'or drop ', errors.Given(argument='data_on_workers'), value=self.local_steps.TAG)
    if self.client_lr is not None and not _first(CLIENT_LR_PATHS, has):
      raise ScheduleError('client_lr', ': this algorithm keeps its client learning rate inside '
                          'its computation (FedProx), so it cannot be scheduled')
    if self.server_lr is not None and not _first(SERVER_LR_PATHS, has):
      raise ScheduleError('server_lr', ': this algorithm has no server learning rate (its '
                          'server step is x − mean Δ: FedGBO, MFL, CE-FedAvg)')
    if self.needs_first_minibatch_loss:
      metrics_type = process.next.type_signature.result[1]
      metrics_type = getattr(metrics_type, 'member', metrics_type)
      found = metrics_type
      for key in FIRST_MINIBATCH_LOSS.split('/')[1:]:
        found = None if found is None else _type_child(found, key)
      if found is None:
        name = next(n for n, s in self._all().items()
                    if s is not None and s.feedback == schedules.FEEDBACK_FIRST_MINIBATCH_LOSS)
        raise ScheduleError(name, " needs the loss of each client's first minibatch, which this "
                            'algorithm (built by TFF, not the package composer) does not report',
                            value='error')

  # ---- before a round ----
  def apply(self, state: Any, round_num: int) -> tuple[Any, Optional[int], dict[str, float]]:
    """Returns (state for round `round_num` (1-based), K for the data, metrics).

    The K for the data is None when the process runs K_t itself (it is in
    its state) or when K is not scheduled.
    """
    t = round_num - 1
    has = lambda p: _get(state, p) is not None
    row = {}
    data_k = None
    values = {name: (None if s is None else s.value(t)) for name, s in self._all().items()}
    for name, paths in (('local_steps', LOCAL_STEPS_PATHS), ('client_lr', CLIENT_LR_PATHS),
                        ('server_lr', SERVER_LR_PATHS)):
      path = _first(paths, has)
      value = values[name]
      if value is not None:
        if path is not None:
          state = _replace(state, path, value)
        elif name == 'local_steps':
          data_k = int(value)  # TFF-built processes: exactly K_t batches of data
        else:
          raise ScheduleError(name, ": this algorithm's state has no "
                              f'{"client" if name == "client_lr" else "server"} learning rate')
      current = value if value is not None else (None if path is None else _get(state, path))
      if name == 'local_steps' and current is not None and current < 1:
        current = None  # K = 0: the process runs epochs, not a step count
      if current is not None:
        key = {'local_steps': 'local_steps', 'client_lr': 'client_learning_rate',
               'server_lr': 'server_learning_rate'}[name]
        row[f'schedule/{key}'] = float(current)
    return state, data_k, row

  # ---- after a round ----
  def observe(self, round_num: int, row: Mapping[str, float], num_clients: int) -> dict[str, float]:
    """Feeds feedback schedules; returns accounting metrics for the round."""
    t = round_num - 1
    for schedule in self._all().values():
      if schedule is None or schedule.feedback is None:
        continue
      if schedule.feedback == schedules.FEEDBACK_FIRST_MINIBATCH_LOSS:
        # The process reports the clients' (unweighted) mean; one copy per
        # client makes the schedule's pooled window mean the thesis' 1/(sN) ΣΣ
        # even when a round has fewer clients.
        loss = float(row.get(FIRST_MINIBATCH_LOSS, math.nan))
        schedule.observe(t, [loss] * max(num_clients, 1))
      elif self._is_regular_eval(round_num, row):
        schedule.observe(t, self._validation_score(row))
    out = {}
    steps = float(row.get('cost/client_steps', 0.0))
    self.steps_total += steps
    if self.local_steps is not None:
      self.constant_k_steps_total += num_clients * self.local_steps.base
      out['schedule/step_fraction_vs_constant_k0'] = (
          self.steps_total / max(self.constant_k_steps_total, 1.0))
    # Every client runs K_t steps when K is scheduled; otherwise (epochs) the
    # mean per client stands in for the slowest client's steps.
    k = row.get('schedule/local_steps', steps / max(num_clients, 1))
    round_seconds = runtime_model.client_round_seconds(
        row.get('cost/download_bits_per_client', 0.0), row.get('cost/upload_bits_per_client', 0.0),
        k, self.step_seconds, self.down_mbps, self.up_mbps)
    self.sim_seconds_total += round_seconds
    out['sim/round_seconds'] = round_seconds
    out['sim/cumulative_minutes'] = self.sim_seconds_total / 60.0
    return out

  def _is_regular_eval(self, round_num: int, row: Mapping[str, float]) -> bool:
    if VALIDATION_ACCURACY not in row and VALIDATION_LOSS not in row:
      return False
    return self.rounds_per_eval is None or round_num % self.rounds_per_eval == 0

  @staticmethod
  def _validation_score(row: Mapping[str, float]) -> float:
    """Higher is better: the accuracy, or −loss for tasks without one."""
    if VALIDATION_ACCURACY in row:
      return float(row[VALIDATION_ACCURACY])
    return -float(row[VALIDATION_LOSS])

  # ---- checkpointing ----
  def to_json(self) -> str:
    return json.dumps({
        'schedules': {k: (None if s is None else s.state()) for k, s in self._all().items()},
        'steps_total': self.steps_total, 'constant_k_steps_total': self.constant_k_steps_total,
        'sim_seconds_total': self.sim_seconds_total,
        # A measured β (step_seconds set after a timing) is kept, so the resumed run's
        # simulated time continues at the same rate.
        'step_seconds': self.step_seconds})

  def restore(self, text: str) -> None:
    saved = json.loads(text)
    for name, state in saved['schedules'].items():
      setattr(self, name, None if state is None else schedules.schedule_from_state(state))
    self.steps_total = saved['steps_total']
    self.constant_k_steps_total = saved['constant_k_steps_total']
    self.sim_seconds_total = saved['sim_seconds_total']
    self.step_seconds = saved.get('step_seconds', self.step_seconds)
