"""bin/train's flags, read once into frozen, typed settings.

The binary (or a test, or a script) turns its flag values into a `Settings`
here, once; everything below receives a `Settings`, one of its groups, or
plain keyword arguments, never the flag dict. The groups are the flag table's
(`workflow/flags/train_flags.py:GROUPS`: names, kinds, defaults and help live there
only) and their classes are made from it, a field per flag with its flag's
name: a new flag's entry is its field, and a message about a field names the
flag (`--client_learning_rate`) with no table in between. The task group is
`tasks.settings.TaskSettings`, which the tasks layer builds tasks from (its
fields are the table's task flags: tests/test_config.py). `flag_values()`
turns settings back into the flat dict a run directory keeps (flags.json) and
a command line is made of.

    settings = config.from_flags({'task': 'digits', 'algorithm': 'fedadam'})
    settings.client.client_learning_rate     # 0.1, the flag's default
    settings.replace(total_rounds=5).loop.total_rounds
"""

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

from tasks.settings import TaskSettings
from workflow.flags import train_flags


_TYPES = {'string': str, 'enum': str, 'integer': int, 'float': float, 'bool': bool}
# The flags besides the seed and the directory in which the members of one
# population (bin/train --together, bin/sweep --together) may differ: the
# hyperparameters the processes keep in their state (the table's `in_state`).
POPULATION_HPARAMS = tuple(f.name for _, _, group in train_flags.GROUPS for f in group
                           if f.in_state)
# The learning-rate schedules' flags: each member's loop applies its own schedule
# to its own state before the round (`program.Loop.prepare`), so they never reach
# the program either.
POPULATION_SCHEDULES = tuple(f.name for prefix in ('client', 'server')
                             for f in train_flags.lr_schedule_flags(prefix))
POPULATION_VARYING = POPULATION_HPARAMS + POPULATION_SCHEDULES


def _group_class(class_name: str, group_key: str, doc: str) -> type:
  """The frozen settings class of the table's group `group_key`: a field per flag, in
  table order, typed by the flag's kind (Optional where its default is None)."""
  group = {key: flags for key, _, flags in train_flags.GROUPS}[group_key]
  fields = [(f.name, Optional[_TYPES[f.kind]] if f.default is None else _TYPES[f.kind])
            for f in group]
  cls = dataclasses.make_dataclass(class_name, fields, frozen=True)
  cls.__module__, cls.__doc__ = __name__, doc
  return cls


ClientSettings = _group_class('ClientSettings', 'client',
                              'Sampling, local work and the client optimiser.')
ServerSettings = _group_class('ServerSettings', 'server', 'The algorithm and its server optimiser.')
AlgorithmSettings = _group_class('AlgorithmSettings', 'algorithm',
                                 'Hyperparameters only some algorithms read (train_flags says '
                                 'which).')
AggregationSettings = _group_class('AggregationSettings', 'aggregation',
                                   'TFF aggregators, upload compression and differential privacy.')
ScheduleSettings = _group_class('ScheduleSettings', 'schedules',
                                'Schedules of K, η and η_s, and the wall-clock runtime model.')
PersonalizedSettings = _group_class('PersonalizedSettings', 'personalized',
                                    'Personalised FL (MTFL, Per-FedAvg, pFedMe) and noisy '
                                    'clients.')
DiagnosticsSettings = _group_class('DiagnosticsSettings', 'diagnostics', 'Diagnostics.')
LoopSettings = _group_class('LoopSettings', 'loop', 'The training loop and where it writes.')
ReliabilitySettings = _group_class('ReliabilitySettings', 'reliability',
                                   'When a run stops, and resuming damaged runs.')
ExecutionSettings = _group_class('ExecutionSettings', 'execution',
                                 'Cohort or per-client rounds, the local runtime and TFF workers.')


# Settings' attribute → the flag group (train_flags.GROUPS key) it holds.
GROUP_CLASSES: dict[str, type] = {
    'task': TaskSettings, 'client': ClientSettings, 'server': ServerSettings,
    'algorithm': AlgorithmSettings, 'aggregation': AggregationSettings,
    'schedules': ScheduleSettings, 'personalized': PersonalizedSettings,
    'diagnostics': DiagnosticsSettings, 'loop': LoopSettings,
    'reliability': ReliabilitySettings, 'execution': ExecutionSettings,
}


@dataclasses.dataclass(frozen=True)
class Settings:
  """One run's settings: a frozen group per flag group (`--preset` is expanded, not kept)."""
  task: TaskSettings
  client: ClientSettings
  server: ServerSettings
  algorithm: AlgorithmSettings
  aggregation: AggregationSettings
  schedules: ScheduleSettings
  personalized: PersonalizedSettings
  diagnostics: DiagnosticsSettings
  loop: LoopSettings
  reliability: ReliabilitySettings
  execution: ExecutionSettings

  def flag_values(self) -> dict[str, Any]:
    """The flat {flag: value} of these settings, in the flag table's order (flags.json)."""
    values = {}
    for group in GROUP_CLASSES:
      values.update(dataclasses.asdict(getattr(self, group)))
    return {name: values[name] for name in train_flags.TRAIN_FLAG_NAMES}

  def replace(self, **flags: Any) -> 'Settings':
    """These settings with some flags changed (by flag name); TypeError for an unknown one."""
    return from_flags({**self.flag_values(), **flags})


def from_flags(values: Mapping[str, Any]) -> Settings:
  """The settings of {flag: value} (bin/train's flag names); absent flags take their defaults.

  Only names and grouping are checked here (TypeError naming an unknown flag);
  values are checked by `workflow.flags.validation.validate(settings)`.
  """
  unknown = sorted(set(values) - set(train_flags.TRAIN_FLAG_NAMES))
  if unknown:
    raise TypeError(f'unknown bin/train flags: {", ".join("--" + n for n in unknown)}')
  full = {**train_flags.DEFAULTS, **values}
  groups = {}
  for attribute, cls in GROUP_CLASSES.items():
    groups[attribute] = cls(**{f.name: full[f.name] for f in dataclasses.fields(cls)})
  return Settings(**groups)


def num_epochs(settings: Settings) -> int:
  """Epochs of client data a task's datasets repeat: with exactly K local steps the loop
  cycles the data itself, so one."""
  return 1 if settings.client.local_steps else settings.client.client_epochs_per_round
