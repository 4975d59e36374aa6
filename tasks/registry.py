"""Task names (`--task`) → `FederatedTask` builders from a flat config."""

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


def create_task(name: str, cfg: Mapping[str, Any]) -> base.FederatedTask:
  if name not in TASKS:
    raise ValueError(f'--task must be one of {", ".join(sorted(TASKS))}; got {name!r}')
  return TASKS[name](cfg)
