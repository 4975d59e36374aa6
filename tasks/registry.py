"""Task names (`--task`) → `FederatedTask` builders from a flat config.

Besides the registered names, `--task=package.module:function` trains a task
defined outside this package: `function(config)` (or `function()`) returns a
`tasks.base.FederatedTask`; `config` is the run's flag dict (docs/tasks.md,
"Your own task"). The module is imported from `sys.path` or, failing that,
from the current directory.
"""

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from tasks import base
from tasks import cifar10_lda
from tasks import digits
from tasks import gld
from tasks import leaf
from tasks import synthetic
from tasks import thesis
from tasks import tff_native
from tasks import vit_tasks


def _digits(cfg: Mapping[str, Any]) -> base.FederatedTask:
  return digits.create_task(
      partition=cfg['partition'], num_clients=cfg['num_clients'] or 20,
      alpha=cfg['dirichlet_alpha'], model=cfg['digits_model'],
      batch_size=cfg['client_batch_size'], num_epochs=_epochs(cfg), seed=cfg['seed'])


def _synthetic(cfg: Mapping[str, Any]) -> base.FederatedTask:
  return synthetic.create_task(
      alpha=cfg['synthetic_alpha'], beta=cfg['synthetic_beta'],
      num_clients=cfg['num_clients'] or 30, batch_size=cfg['client_batch_size'],
      num_epochs=_epochs(cfg), seed=cfg['seed'])


def _epochs(cfg):
  # With exactly K local steps the loop cycles the data itself.
  return 1 if cfg.get('local_steps') else cfg['client_epochs_per_round']


def _file_task(builder: Callable[[Mapping[str, Any]], base.FederatedTask]):
  """Tasks read from --data_dir (TFF, LEAF, Keras files); see docs/tasks.md."""
  def build(cfg: Mapping[str, Any]) -> base.FederatedTask:
    return builder(dict(cfg, num_epochs=_epochs(cfg)))
  return build


TASKS: dict[str, Callable[[Mapping[str, Any]], base.FederatedTask]] = {
    'digits': _digits,
    'synthetic': _synthetic,
    **{name: _file_task(builder) for name, builder in tff_native.TASK_BUILDERS.items()},
    **{name: _file_task(builder) for name, builder in leaf.TASK_BUILDERS.items()},
    **{name: _file_task(builder) for name, builder in thesis.TASK_BUILDERS.items()},
}
# Seed 002's ViT-S/16 tasks and seed 003's CIFAR-10 split (docs/tasks_vit.md).
TASKS.update({
    'cifar100_image': _file_task(vit_tasks.cifar100_image_or_vit(
        tff_native.TASK_BUILDERS['cifar100_image'])),
    'cifar10': _file_task(cifar10_lda.cifar10_or_lda(thesis.TASK_BUILDERS['cifar10'])),
    'gld23k': _file_task(gld.create_gld23k),
})


def is_custom(name: str) -> bool:
  """Whether `name` is a `package.module:function` task."""
  return ':' in name


def custom_task_function(name: str) -> Callable[..., base.FederatedTask]:
  """The function of `--task=package.module:function`; ValueError naming --task if absent."""
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
  return function


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


def _call_task_function(name: str, cfg: Mapping[str, Any]) -> base.FederatedTask:
  function = custom_task_function(name)
  try:
    takes_config = bool(inspect.signature(function).parameters)
  except (TypeError, ValueError):
    takes_config = True
  try:
    task = function(cfg) if takes_config else function()
  except Exception as e:  # pylint: disable=broad-except  (user code)
    raise TaskCodeError(f'--task={name} raised {_describe(e)}') from e
  if not isinstance(task, base.FederatedTask):
    raise ValueError(f'--task={name} returned {type(task).__name__}, not a '
                     'tasks.base.FederatedTask')
  return task


def create_task(name: str, cfg: Mapping[str, Any]) -> base.FederatedTask:
  if is_custom(name):
    return _call_task_function(name, cfg)
  if name not in TASKS:
    raise ValueError(f'--task must be one of {", ".join(sorted(TASKS))}, or '
                     f'package.module:function; got {name!r}')
  return TASKS[name](cfg)
