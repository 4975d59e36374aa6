"""tasks.registry: a factory gets exactly the arguments its signature names.

Registered factories and `--task=package.module:function` follow one rule:
keyword parameters named after `TaskSettings` fields or the run's
batch_size / num_epochs / seed / run_dir; anything else in a user's function
is a ValueError naming --task and the parameter.
"""

import dataclasses
import inspect
import textwrap

import pytest

from tasks import registry
from tasks.settings import TaskSettings

RUN = dict(batch_size=5, num_epochs=2, seed=7, run_dir='/tmp/run')


@pytest.mark.parametrize('name', sorted(registry.TASKS))
def test_registered_factories_name_only_what_create_task_passes(name):
  parameters = inspect.signature(registry.factory(name)).parameters.values()
  assert parameters, name
  for parameter in parameters:
    assert parameter.name in registry.ARGUMENT_NAMES, (name, parameter.name)
    assert parameter.kind == parameter.KEYWORD_ONLY, (name, parameter.name)


def test_create_task_passes_exactly_the_named_arguments(monkeypatch):
  received = []

  def factory(*, num_clients, femnist_model, batch_size, run_dir):
    received.append(dict(num_clients=num_clients, femnist_model=femnist_model,
                         batch_size=batch_size, run_dir=run_dir))
    return 'built'

  monkeypatch.setitem(registry.TASKS, 'probe', factory)
  settings = TaskSettings(task='probe', num_clients=3, femnist_model='dnn')
  assert registry.create_task(settings, **RUN) == 'built'
  assert received == [dict(num_clients=3, femnist_model='dnn', batch_size=5, run_dir='/tmp/run')]


def test_unknown_task_names_the_flag():
  with pytest.raises(ValueError, match='--task must be one of .*digits.*got \'nope\''):
    registry.create_task(TaskSettings(task='nope'), **RUN)


def test_digits_reads_the_task_flags_and_run_arguments():
  task = registry.create_task(TaskSettings(task='digits', num_clients=4, partition='iid'),
                              batch_size=3, num_epochs=1, seed=0)
  assert len(task.train_data.client_ids) == 4
  first = task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0])
  assert int(next(iter(task.preprocess_train(first)))['x'].shape[0]) == 3
  # 0 clients: the task's own default.
  default = registry.create_task(TaskSettings(task='digits'), batch_size=3, num_epochs=1, seed=0)
  assert len(default.train_data.client_ids) == 20


_USER_MODULE = '''
from tasks import digits

SEEN = []


def no_parameters():
  SEEN.append(())
  return digits.create_task(num_clients=2, partition='iid')


def named(batch_size, seed, num_clients, data_dir, run_dir=None):
  SEEN.append((batch_size, seed, num_clients, data_dir, run_dir))
  return digits.create_task(num_clients=2, partition='iid', batch_size=batch_size, seed=seed)


def flag_dict(config):
  return config


def misspelt(batch_size, numclients):
  return batch_size, numclients


def keywords(**flags):
  return flags
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch, request):
  name = f'user_tasks_{request.node.name.replace("[", "_").replace("]", "")}'
  (tmp_path / f'{name}.py').write_text(textwrap.dedent(_USER_MODULE))
  monkeypatch.syspath_prepend(str(tmp_path))
  return name


def test_custom_task_gets_its_named_parameters(user_module):
  settings = TaskSettings(task=f'{user_module}:named', num_clients=9, data_dir='/data')
  task = registry.create_task(settings, **RUN)
  assert len(task.train_data.client_ids) == 2
  module = __import__(user_module)
  assert module.SEEN == [(5, 7, 9, '/data', '/tmp/run')]
  registry.create_task(dataclasses.replace(settings, task=f'{user_module}:no_parameters'), **RUN)
  assert module.SEEN[-1] == ()


@pytest.mark.parametrize('function,parameter', [('flag_dict', 'config'),
                                                ('misspelt', 'numclients'),
                                                ('keywords', 'flags')])
def test_custom_task_parameter_outside_the_set_names_task_and_parameter(user_module, function,
                                                                        parameter):
  name = f'{user_module}:{function}'
  for call in (lambda: registry.custom_task_function(name),  # bin/train's validation
               lambda: registry.create_task(TaskSettings(task=name), **RUN)):
    with pytest.raises(ValueError) as raised:
      call()
    message = str(raised.value)
    assert f'--task={name}' in message and repr(parameter) in message, message
    assert not isinstance(raised.value, registry.TaskCodeError)
