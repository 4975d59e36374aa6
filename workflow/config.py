"""bin/train's flags, read once into frozen, typed settings.

The binary (or a test, or a script) turns its flag values into a `Settings`
here, once; everything below receives a `Settings`, one of its groups, or
plain keyword arguments, never the flag dict. The groups are the flag table's
(`workflow/train_flags.py:GROUPS`: names, kinds, defaults and help live there
only), and a field has its flag's name, so a message about a field names the
flag (`--client_learning_rate`) with no table in between. `flag_values()`
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
from workflow import train_flags


@dataclasses.dataclass(frozen=True)
class ClientSettings:
  """Sampling, local work and the client optimiser."""
  clients_per_round: int
  client_batch_size: int
  client_epochs_per_round: int
  local_steps: int  # 0: epochs (client_epochs_per_round) instead of K steps
  client_optimizer: str
  client_learning_rate: float
  client_beta_1: float
  client_beta_2: float
  client_epsilon: float
  client_weighting: str


@dataclasses.dataclass(frozen=True)
class ServerSettings:
  """The algorithm and its server optimiser."""
  algorithm: str
  server_optimizer: str  # '': the algorithm's own
  server_learning_rate: float
  server_optimizer_semantics: str
  server_beta_1: float
  server_beta_2: float
  server_epsilon: float


@dataclasses.dataclass(frozen=True)
class AlgorithmSettings:
  """Hyperparameters only some algorithms read (train_flags says which)."""
  fedgbo_upload: str
  mfl_bias_correction: bool
  fedprox_mu: float
  fedmax_beta: float
  preconditioner: str
  client_lr_warmup: bool
  sm3_variant: str
  sm3_delay: int
  client_bias_correction: bool


@dataclasses.dataclass(frozen=True)
class AggregationSettings:
  """TFF aggregators, upload compression and differential privacy."""
  aggregator: str
  aggregator_zeroing: bool
  aggregator_clipping: bool
  upload_compression: str
  sparsity: float
  dp: bool
  dp_clip_norm: Optional[float]
  dp_noise_multiplier: Optional[float]
  dp_delta: float  # 0: 1 / population


@dataclasses.dataclass(frozen=True)
class ScheduleSettings:
  """Schedules of K, η and η_s, and the wall-clock runtime model."""
  local_steps_schedule: str
  local_steps_decay: Optional[float]
  local_steps_theory_b: Optional[float]
  schedule_window: Optional[int]
  plateau_patience: Optional[int]
  plateau_min_delta: Optional[float]
  client_lr_schedule: str
  client_lr_decay_rate: Optional[float]
  client_lr_decay_steps: Optional[int]
  client_lr_staircase: Optional[bool]
  client_lr_warmup_rounds: Optional[int]
  server_lr_schedule: str
  server_lr_decay_rate: Optional[float]
  server_lr_decay_steps: Optional[int]
  server_lr_staircase: Optional[bool]
  server_lr_warmup_rounds: Optional[int]
  step_time_seconds: float
  measure_step_time: bool
  download_mbps: float
  upload_mbps: float

  def watching_evaluations(self) -> list[str]:
    """The `--<schedule>=step` flags set: these schedules decay on evaluations,
    so which rounds evaluate is part of the run's computation."""
    return [f'--{name}=step' for name in ('local_steps_schedule', 'client_lr_schedule',
                                          'server_lr_schedule') if getattr(self, name) == 'step']


@dataclasses.dataclass(frozen=True)
class PersonalizedSettings:
  """Personalised FL (MTFL, Per-FedAvg, pFedMe) and noisy clients."""
  private: str
  mtfl_strategy: str
  perfedavg_beta: float
  pfedme_lambda: float
  pfedme_personal_learning_rate: float
  pfedme_inner_steps: int
  pfedme_beta: float
  noisy_client_fraction: float
  noise_stddev: float
  client_state_dir: str


@dataclasses.dataclass(frozen=True)
class DiagnosticsSettings:
  measure_client_drift: bool


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """The training loop and where it writes."""
  total_rounds: int
  rounds_per_eval: int
  first_eval_round: int
  eval_stride: int
  rounds_per_checkpoint: int
  root_output_dir: str
  experiment_name: str  # '': named after the settings (workflow/experiment.py)
  seed: int
  show_progress: bool


@dataclasses.dataclass(frozen=True)
class ReliabilitySettings:
  divergence_factor: Optional[float]
  divergence_rounds: int
  trust_command_line: bool


@dataclasses.dataclass(frozen=True)
class ExecutionSettings:
  """Cohort or per-client rounds, the local runtime and TFF workers."""
  execution: str
  cohort_mode: str
  cohort_jit_compile: str
  execution_concurrency: int
  workers: str
  worker_retry: bool
  data_on_workers: bool


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
  values are checked by `workflow.validation.validate(settings)`.
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
