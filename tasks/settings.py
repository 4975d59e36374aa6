"""What a task is built from: bin/train's task flags as one frozen value.

`tasks.registry.create_task(settings, batch_size=..., num_epochs=..., seed=...)`
passes each task factory the fields its signature names, so a factory's
parameters say what it reads. The defaults here are bin/train's defaults of
the same flags (workflow/flags/train_flags.py reads them from `DEFAULTS`). Plain
dataclasses only: bin/sweep reads the defaults without importing TensorFlow.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  """bin/train's "task" flag group (field = flag name; docs/tasks.md)."""
  task: str = 'digits'
  partition: str = 'dirichlet'
  num_clients: int = 0  # 0: the task's own default
  dirichlet_alpha: float = 0.5
  digits_model: str = 'mlp'
  synthetic_alpha: float = 1.0
  synthetic_beta: float = 1.0
  data_dir: str = ''
  max_client_examples: int = 0  # 0: no cap
  cifar100_image_model: str = 'resnet18'
  emnist_character_model: str = 'cnn_dropout'
  shakespeare_character_model: str = 'lstm'
  femnist_model: str = 'cnn'
  shakespeare_leaf_model: str = 'gru128'
  mnist_model: str = '2nn'
  cifar10_model: str = 'cnn'
  finetune: str = 'head'
  pretrained_weights: str = ''
  allow_random_init: bool = False


DEFAULTS = {f.name: f.default for f in dataclasses.fields(TaskSettings)}
