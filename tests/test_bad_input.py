"""Bad input to bin/train's optimiser flags: `validation.validate` names the flag in one
line, and the binary exits 2 with it (a few cases as subprocesses: each imports TF and TFF)."""

import pytest

import train_config  # pylint: disable=g-bad-import-order
from workflow import errors
from workflow.flags import config
from workflow.flags import validation

# Each class of bad input, several flags each. `validation.validate` is
# what bin/train runs first; one case per class also goes through the real
# binary (each run imports TF and TFF: seconds).
BAD_FLAGS = [
    (['--algorithm=fedgbo', '--client_optimizer=sgd', '--local_steps=5'], '--client_optimizer'),
    (['--algorithm=mfl', '--client_optimizer=yogi'], '--client_optimizer'),
    (['--algorithm=fedadam', '--client_optimizer=adam'], '--client_optimizer'),
    (['--algorithm=mimelite', '--client_optimizer=yogi'], '--client_optimizer'),
    (['--algorithm=fedgbo', '--client_optimizer=adam', '--local_steps=5', '--client_beta_2=1.0'],
     '--client_beta_2'),
    (['--algorithm=mfl', '--client_optimizer=sgdm', '--client_beta_1=-0.5'], '--client_beta_1'),
    (['--algorithm=fedadam', '--server_beta_1=-0.1'], '--server_beta_1'),
    (['--algorithm=fedyogi', '--server_beta_2=1.5'], '--server_beta_2'),
    (['--algorithm=mfl', '--client_optimizer=rmsprop', '--client_epsilon=0'], '--client_epsilon'),
    (['--algorithm=fedgbo', '--client_optimizer=adam', '--local_steps=5',
      '--client_epsilon=-1e-8'], '--client_epsilon'),
    (['--algorithm=fedyogi', '--server_epsilon=-0.001'], '--server_epsilon'),
    (['--algorithm=fedadam', '--server_epsilon=0'], '--server_epsilon'),
    # Their default K = 10 applies unless --local_steps is given: 0 contradicts it.
    (['--algorithm=fedgbo', '--client_optimizer=sgdm', '--local_steps=0'], '--local_steps'),
    (['--algorithm=mimexlite', '--client_optimizer=sgdm', '--local_steps=0'], '--local_steps'),
]
SUBPROCESS_CASES = (0, 4, 8, 13)  # optimiser, β, ε, local steps


def _config(args):
  cfg = dict(task='digits', algorithm='fedavg', client_optimizer='sgd', clients_per_round=10,
             client_learning_rate=0.1, server_learning_rate=1.0, local_steps=0)
  for arg in args:
    name, value = arg[2:].split('=')
    cfg[name] = value if name in ('algorithm', 'client_optimizer') else float(value)
  cfg['local_steps'] = int(cfg['local_steps'])
  return cfg


@pytest.mark.parametrize('args, flag', BAD_FLAGS)
def test_validate_names_the_flag(args, flag):
  with pytest.raises(errors.UsageError) as error:
    validation.validate(config.from_flags(_config(args)))
  message = str(error.value)
  assert flag in message and '\n' not in message


@pytest.mark.slow  # starts bin/train subprocesses: not in `make test-fast`
def test_bin_train_bad_input_exits_2_naming_the_flag(tmp_path):
  cases = [BAD_FLAGS[i] for i in SUBPROCESS_CASES]
  for (args, flag), (result, out) in zip(
      cases, train_config.refused_runs(tmp_path, [args for args, _ in cases])):
    train_config.assert_refused(result, out, flag, args)
