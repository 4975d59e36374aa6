"""workflow/flags/config.py: the flag table and the typed settings hold the same flags."""

import dataclasses

import pytest

from tasks import settings as task_settings
from workflow.flags import config
from workflow.flags import train_flags


def test_each_settings_group_holds_exactly_its_flag_groups_flags():
  table = {key: [f.name for f in group] for key, _, group in train_flags.GROUPS}
  for attribute, cls in config.GROUP_CLASSES.items():
    assert [f.name for f in dataclasses.fields(cls)] == table[attribute], attribute
  assert set(table) - set(config.GROUP_CLASSES) == {'preset'}


def test_task_settings_defaults_are_the_flags_defaults():
  for name, default in task_settings.DEFAULTS.items():
    assert train_flags.DEFAULTS[name] == default, name


def test_settings_round_trip_through_flag_values():
  settings = config.from_flags({'algorithm': 'fedadam', 'client_learning_rate': 0.3})
  assert settings.server.algorithm == 'fedadam'
  assert settings.client.client_learning_rate == 0.3
  assert settings.loop.total_rounds == train_flags.DEFAULTS['total_rounds']
  assert config.from_flags(settings.flag_values()) == settings
  assert list(settings.flag_values()) == list(train_flags.TRAIN_FLAG_NAMES)
  assert settings.replace(total_rounds=7).loop.total_rounds == 7
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.client.client_learning_rate = 1.0


def test_unknown_flag_is_named():
  with pytest.raises(TypeError, match='--client_learningrate'):
    config.from_flags({'client_learningrate': 0.1})
