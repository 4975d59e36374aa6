"""Algorithm names (`--algorithm`) → learning processes built from a config.

Each entry adapts the flat flag config to one builder's typed arguments; the
algorithm itself lives in its own module. Adding an algorithm = one module and
one entry here.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow_federated as tff

from tasks import base as task_base
from tff_adaptive.algorithms import fedopt


class ConfigError(ValueError):
  """A flag value the chosen algorithm cannot use; the message names the flag."""


@dataclasses.dataclass(frozen=True)
class AlgorithmEntry:
  build: Callable[[task_base.FederatedTask, Mapping[str, Any]], tff.learning.templates.LearningProcess]
  client_optimizers: tuple[str, ...] = ('sgd',)
  needs_local_steps: bool = False
  doc: str = ''


def _fedopt_family(algorithm: str):
  def build(task, cfg):
    server_opt_name = cfg.get('server_optimizer') or fedopt.ALGORITHM_SERVER_OPTIMIZER[algorithm]
    if cfg.get('server_optimizer') and server_opt_name != fedopt.ALGORITHM_SERVER_OPTIMIZER[algorithm]:
      raise ConfigError(
          f'--server_optimizer={server_opt_name} contradicts --algorithm={algorithm} (which uses '
          f'{fedopt.ALGORITHM_SERVER_OPTIMIZER[algorithm]}); leave --server_optimizer unset')
    server_opt = fedopt.build_server_optimizer(
        server_opt_name, cfg['server_learning_rate'],
        semantics=cfg.get('server_optimizer_semantics', 'tff'),
        beta_1=cfg.get('server_beta_1', 0.9), beta_2=cfg.get('server_beta_2', 0.99),
        tau=cfg.get('server_epsilon', 1e-3),
        initial_accumulator=cfg.get('server_initial_accumulator'))
    return fedopt.build_fedopt(task.model_fn, client_learning_rate=cfg['client_learning_rate'],
                               server_optimizer=server_opt)
  return build


ALGORITHMS: dict[str, AlgorithmEntry] = {
    name: AlgorithmEntry(_fedopt_family(name), doc=f'FedOpt with server {opt}')
    for name, opt in fedopt.ALGORITHM_SERVER_OPTIMIZER.items()
}


def build(name: str, task: task_base.FederatedTask,
          cfg: Mapping[str, Any]) -> tff.learning.templates.LearningProcess:
  if name not in ALGORITHMS:
    raise ConfigError(f'--algorithm must be one of {", ".join(sorted(ALGORITHMS))}; got {name!r}')
  entry = ALGORITHMS[name]
  client_opt = cfg.get('client_optimizer', 'sgd')
  if client_opt not in entry.client_optimizers:
    raise ConfigError(f'--client_optimizer={client_opt} is not supported by --algorithm={name}; '
                      f'it takes {", ".join(entry.client_optimizers)}')
  if entry.needs_local_steps and not cfg.get('local_steps'):
    raise ConfigError(f'--algorithm={name} needs exactly K local steps: set --local_steps')
  return entry.build(task, cfg)
