"""Task names (`--task`) → `FederatedTask` factories, called with the arguments they name.

`create_task(settings, batch_size=..., num_epochs=..., seed=..., run_dir=...)`
calls the factory of `settings.task` with exactly the arguments its signature
names: keyword parameters named after the fields of `tasks.settings.
TaskSettings` (bin/train's task flags: `data_dir`, `num_clients`,
`femnist_model`, ...) and the run's `batch_size` (--client_batch_size),
`num_epochs` (epochs a client's dataset repeats) and `seed`, and `run_dir`
(the run's directory, None outside a training run). A factory's signature is
therefore the list of what it reads.

The names load without TensorFlow (bin/train checks --task before it
imports TensorFlow): `TASKS` names each factory's module and function, and
`factory(name)` imports it when a task is built.

Besides the registered names, `--task=package.module:function` trains a task
defined outside this package, by the same rule: `function` names the
arguments it wants (a parameter outside that set is a ValueError naming
--task and the parameter; a function without parameters is called without
arguments) and returns a `tasks.base.FederatedTask` (docs/tasks.md, "Your own
task"). The module is imported from `sys.path` or, failing that, from the
current directory.
"""

import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional, Union

from tasks.settings import TaskSettings

if TYPE_CHECKING:
  from tasks import base  # pylint: disable=g-import-not-at-top

# What a task factory may name besides the TaskSettings fields.
RUN_ARGUMENTS = ('batch_size', 'num_epochs', 'seed', 'run_dir')
ARGUMENT_NAMES = tuple(f.name for f in dataclasses.fields(TaskSettings)) + RUN_ARGUMENTS


def _digits(*, partition: str, num_clients: int, dirichlet_alpha: float, digits_model: str,
            batch_size: int, num_epochs: int, seed: int) -> 'base.FederatedTask':
  from tasks import digits  # pylint: disable=g-import-not-at-top
  return digits.create_task(
      partition=partition, num_clients=num_clients or 20, alpha=dirichlet_alpha,
      model=digits_model, batch_size=batch_size, num_epochs=num_epochs, seed=seed)


def _synthetic(*, synthetic_alpha: float, synthetic_beta: float, num_clients: int,
               batch_size: int, num_epochs: int, seed: int) -> 'base.FederatedTask':
  from tasks import synthetic  # pylint: disable=g-import-not-at-top
  return synthetic.create_task(
      alpha=synthetic_alpha, beta=synthetic_beta, num_clients=num_clients or 30,
      batch_size=batch_size, num_epochs=num_epochs, seed=seed)


# Task name → its factory, as 'module:function' (imported by `factory`), or the
# factory itself (a script or test may register one at run time).
TASKS: dict[str, Union[str, Callable[..., 'base.FederatedTask']]] = {
    'digits': 'tasks.registry:_digits',
    'synthetic': 'tasks.registry:_synthetic',
    # TFF's simulation datasets (docs/tasks.md).
    'emnist_character': 'tasks.tff_native:create_emnist_character',
    'emnist_autoencoder': 'tasks.tff_native:create_emnist_autoencoder',
    'shakespeare_character': 'tasks.tff_native:create_shakespeare_character',
    'stackoverflow_word': 'tasks.tff_native:create_stackoverflow_word',
    'stackoverflow_tag': 'tasks.tff_native:create_stackoverflow_tag',
    # LEAF's JSON format.
    'sent140': 'tasks.leaf:create_sent140',
    'femnist': 'tasks.leaf:create_femnist',
    'shakespeare_leaf': 'tasks.leaf:create_shakespeare_leaf',
    # The thesis' MNIST; its CIFAR-10 goes through cifar10_lda (Dirichlet split).
    'mnist': 'tasks.thesis:create_mnist',
    # The ViT-S/16 image tasks (docs/tasks_vit.md), which dispatch to TFF's
    # CIFAR-100 and the thesis' CIFAR-10 for their CNNs.
    'cifar100_image': 'tasks.vit_tasks:create_cifar100_image',
    'cifar10': 'tasks.cifar10_lda:create_cifar10',
    'gld23k': 'tasks.gld:create_gld23k',
}


# Tasks whose models are recurrent (GRU, LSTM): bin/train's --intra_op_threads=0
# runs them with one intra-op thread (their cohort's lanes, docs/performance.md).
RECURRENT_TASKS = frozenset({'shakespeare_character', 'stackoverflow_word', 'shakespeare_leaf'})


def factory(name: str) -> Callable[..., 'base.FederatedTask']:
  """The factory of the registered task `name` (its module imported now)."""
  target = TASKS[name]
  if callable(target):
    return target
  module_name, _, function_name = target.partition(':')
  return getattr(importlib.import_module(module_name), function_name)


def is_custom(name: str) -> bool:
  """Whether `name` is a `package.module:function` task."""
  return ':' in name


def custom_task_function(name: str) -> Callable[..., 'base.FederatedTask']:
  """The function of `--task=package.module:function`; ValueError naming --task if absent,
  or if it has a parameter that `create_task` cannot fill (checked here, before any output)."""
  module_name, _, function_name = name.partition(':')
  if not module_name or not function_name:
    raise ValueError(f'--task={name}: expected package.module:function')
  try:
    module = _import_user_module(name, module_name)
  except ImportError as e:
    if (os.getcwd() in sys.path or not isinstance(e, ModuleNotFoundError)
        or e.name != module_name.split('.')[0]):
      raise ValueError(f'--task={name}: cannot import {module_name} ({e})') from None
    sys.path.append(os.getcwd())  # a module beside the user's command
    try:
      module = _import_user_module(name, module_name)
    except ImportError as e2:
      raise ValueError(f'--task={name}: cannot import {module_name} ({e2})') from None
  function = getattr(module, function_name, None)
  if not callable(function):
    raise ValueError(f'--task={name}: {module_name} has no function {function_name!r}')
  _custom_parameters(name, function)
  return function


def _custom_parameters(name: str, function: Callable[..., Any]) -> tuple[str, ...]:
  """The argument names `function` takes, each one `create_task` can pass by name."""
  try:
    parameters = inspect.signature(function).parameters.values()
  except (TypeError, ValueError):
    return ()  # no signature to read (a builtin): called without arguments
  names = []
  for parameter in parameters:
    if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
      raise ValueError(f'--task={name}: parameter {parameter.name!r} of the task function: '
                       'name each argument it takes (' + ', '.join(ARGUMENT_NAMES) + ')')
    if parameter.kind == parameter.POSITIONAL_ONLY:
      raise ValueError(f'--task={name}: the task function\'s parameter {parameter.name!r} is '
                       'positional-only; create_task passes arguments by name')
    if parameter.name not in ARGUMENT_NAMES:
      raise ValueError(f'--task={name}: the task function\'s parameter {parameter.name!r} is '
                       'neither a task flag nor a run argument; a task function takes any of '
                       + ', '.join(ARGUMENT_NAMES) + ' by name (docs/tasks.md, "Your own task")')
    names.append(parameter.name)
  return tuple(names)


class TaskCodeError(ValueError):
  """The code of a `package.module:function` task raised; `__cause__` is its exception."""


# The environment variable that shows the traceback of a TaskCodeError (bin/train).
TRACEBACK_HINT = 'TFF_ADAPTIVE_TRACEBACK=1 shows the traceback'


def _describe(error: BaseException) -> str:
  text = (str(error).strip().splitlines() or [''])[0]
  where = ''
  if isinstance(error, SyntaxError) and error.filename:
    where = f' ({error.filename}, line {error.lineno})'
    text = error.msg or text
  return f'{type(error).__name__}: {text}{where} ({TRACEBACK_HINT})'


def _import_user_module(name: str, module_name: str):
  try:
    return importlib.import_module(module_name)
  except ImportError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (user code)
    raise TaskCodeError(f'--task={name}: importing {module_name} failed: {_describe(e)}') from e


def _call_task_function(name: str, arguments: Callable[[tuple[str, ...]], dict[str, Any]]
                        ) -> 'base.FederatedTask':
  from tasks import base  # pylint: disable=g-import-not-at-top,redefined-outer-name
  function = custom_task_function(name)
  wanted = arguments(_custom_parameters(name, function))
  try:
    task = function(**wanted)
  except Exception as e:  # pylint: disable=broad-except  (user code)
    raise TaskCodeError(f'--task={name} raised {_describe(e)}') from e
  if not isinstance(task, base.FederatedTask):
    raise ValueError(f'--task={name} returned {type(task).__name__}, not a '
                     'tasks.base.FederatedTask')
  return task


def arguments_named(name: str) -> tuple[str, ...]:
  """The arguments the factory of `--task=name` takes (ValueError as `create_task`)."""
  if is_custom(name):
    return _custom_parameters(name, custom_task_function(name))
  if name not in TASKS:
    raise ValueError(f'--task must be one of {", ".join(sorted(TASKS))}, or '
                     f'package.module:function; got {name!r}')
  return tuple(inspect.signature(factory(name)).parameters)


def create_task(settings: TaskSettings, *, batch_size: int, num_epochs: int, seed: int,
                run_dir: Optional[str] = None) -> 'base.FederatedTask':
  """The task `settings.task` names, built from the arguments its factory names.

  Args:
    settings: bin/train's task flags.
    batch_size: the client minibatch size (--client_batch_size).
    num_epochs: epochs each client's training dataset repeats
      (`workflow.flags.config.num_epochs`: 1 with --local_steps).
    seed: the run's seed (client splits, model initialisation, shuffling).
    run_dir: the run's directory, for a task that keeps files with its run
      (cifar10's split); None outside a training run.
  """
  name = settings.task
  run = dict(batch_size=batch_size, num_epochs=num_epochs, seed=seed, run_dir=run_dir)

  def arguments(names: tuple[str, ...]) -> dict[str, Any]:
    return {key: run[key] if key in run else getattr(settings, key) for key in names}

  if is_custom(name):
    return _call_task_function(name, arguments)
  wanted = arguments(arguments_named(name))
  return factory(name)(**wanted)
