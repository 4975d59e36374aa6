"""The algorithm registry is the one home of what each algorithm supports.

--help's readers, validation, the personalisation lists and the README table
are derived from `workflow.flags.algorithms.ALGORITHMS`; builders get the round
options as keywords; and adding an algorithm is its module plus one entry
(`test_a_toy_algorithm_is_its_module_and_one_entry`, in a copy of the code).
"""

import os
import shutil
import subprocess
import sys

import pytest

from workflow import errors
from workflow.flags import algorithm_table
from workflow.flags import algorithms
from workflow.flags import config
from workflow.flags import train_flags
from workflow.flags import train_help
from workflow.flags import validation
from workflow.training import algorithm_builders
from workflow.training import cli
from workflow.training import personalization

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_table_is_the_generated_one():
  with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
    readme = f.read()
  assert algorithm_table.between_markers(readme) == algorithm_table.markdown(), (
      "README.md's algorithm table is out of date: run bin/algorithm_table.py --write")
  for name in algorithms.ALGORITHMS:
    assert f'| `{name}` |' in algorithm_table.markdown()


def test_lists_are_derived_from_the_entries():
  assert personalization.PERSONALIZED_ALGORITHMS == ('mtfl', 'perfedavg', 'pfedme')
  assert personalization.CLIENT_STATE_ALGORITHMS == ('mtfl', 'perfedavg', 'pfedme', 'feddyn',
                                                     'scaffold')
  assert algorithms.per_client_only() == {}  # every algorithm runs as a cohort
  assert set(algorithms.ALGORITHMS) - set(algorithms.having('compressible')) == {
      'feddyn', 'mimelite', 'mimexlite', 'mtfl', 'perfedavg', 'pfedme', 'scaffold'}
  assert set(algorithms.ALGORITHMS) - set(algorithms.having('measures_client_drift')) == {
      'mtfl', 'perfedavg', 'pfedme'}
  readers = train_help.readers(train_flags.FLAGS_BY_NAME['upload_compression'])
  assert readers == algorithms.having('compressible')
  assert 'fedada2' not in train_help.readers(
      train_flags.FLAGS_BY_NAME['server_optimizer_semantics'])
  for entry in algorithms.ALGORITHMS.values():
    assert entry.keeps_client_state or not entry.personalized
    assert entry.doc


@pytest.mark.parametrize('args, flag', [
    (['--algorithm=fedavg', '--client_optimizer=adam'], '--client_optimizer'),
    (['--algorithm=mimexlite', '--local_steps=0'], '--local_steps'),
    (['--algorithm=mimelite', '--upload_compression=topk'], '--upload_compression'),
    (['--algorithm=scaffold', '--upload_compression=topk'], '--upload_compression'),
    (['--algorithm=pfedme', '--dp', '--dp_clip_norm=1', '--dp_noise_multiplier=1'], '--dp'),
    (['--algorithm=ce_fedavg', '--aggregator=robust', '--upload_compression=none'],
     '--aggregator'),
    (['--algorithm=pfedme', '--measure_client_drift'], '--measure_client_drift'),
])
def test_one_check_refuses_in_validation_and_in_build(args, flag):
  settings, _ = cli.config_from_args(args)
  with pytest.raises(errors.UsageError) as usage:
    validation.validate(settings)
  with pytest.raises(algorithms.ConfigError) as refused:
    algorithm_builders.build(None, settings)  # refused before the task is used
  assert str(usage.value) == str(refused.value)
  assert flag in str(usage.value) and '\n' not in str(usage.value)


class _Process:
  pass


def test_round_options_reach_the_entry_as_keywords(monkeypatch):
  seen = {}

  def build(task, settings, **options):
    del task, settings
    seen.update(options)
    return _Process()

  monkeypatch.setitem(algorithms.ALGORITHMS, 'recorder', algorithms.AlgorithmEntry(build, 'test'))
  settings = config.from_flags({'algorithm': 'recorder', 'client_learning_rate': 0.1,
                                'measure_client_drift': True, 'execution': 'per_client'})
  built = algorithm_builders.built(None, settings)
  assert isinstance(built.process, _Process) and built.recipe is None
  assert seen == {'measure_client_drift': True, 'execution': 'per_client'}
  assert algorithm_builders.execution_line(built) == (
      'execution: per_client (--execution=per_client)')
  monkeypatch.setitem(algorithms.ALGORITHMS, 'recorder', algorithms.AlgorithmEntry(
      build, 'test', cohort=algorithms.No('a reason of its own')))
  built = algorithm_builders.built(None, settings.replace(execution='cohort'))
  assert seen['execution'] == 'per_client'
  assert algorithm_builders.execution_line(built) == (
      'execution: per_client (--algorithm=recorder: a reason of its own)')


TOY_MODULE = '''\
"""Toy: FedAvg through the round composer, registered by a test in one entry."""

from tff_adaptive.algorithms import fedopt



def build_toy(model_fn, client_optimizer_fn, server_optimizer_fn=None, *, local_steps=0,
              **options):
  """FedAvg named toy: the package's usual builder signature."""
  return fedopt.build_fedopt(model_fn, client_optimizer_fn, server_optimizer_fn,
                             local_steps=local_steps, algorithm='toy', **options)
'''
TOY_ENTRY = ("    'toy': AlgorithmEntry('tff_adaptive.algorithms.toy:build_toy', 'a toy FedAvg', "
             "('sgd', 'sgdm')),\n")
REGISTRY_START = 'ALGORITHMS: dict[str, AlgorithmEntry] = {\n'


def _copy_with_toy(tmp_path):
  """The checkout's code in tmp_path, plus the toy's module and its one entry."""
  ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
  for folder in ('tff_adaptive', 'workflow', 'tasks', 'bin'):
    shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder, ignore=ignore)
  (tmp_path / 'tff_adaptive' / 'algorithms' / 'toy.py').write_text(TOY_MODULE)
  registry = tmp_path / 'workflow' / 'flags' / 'algorithms.py'
  text = registry.read_text()
  assert text.count(REGISTRY_START) == 1
  text = text.replace(REGISTRY_START, REGISTRY_START + TOY_ENTRY)
  registry.write_text(text)


def _run(tmp_path, *args):
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=300)


def _flag_block(help_text, flag):
  """The lines of --help about `--flag` (from its line to the next flag's)."""
  start = help_text.index(f'\n  --{flag}')
  return help_text[start:help_text.index('\n  --', start + 1)]


@pytest.fixture(scope='module')
def toy_copy(tmp_path_factory):
  """A copy of the checkout's code with the toy added (its module and one entry)."""
  path = tmp_path_factory.mktemp('toy')
  _copy_with_toy(path)
  return path


def test_a_toy_algorithm_is_its_module_and_one_entry(toy_copy):
  # --help lists it, with the client optimisers it takes and as a reader of its features.
  help_text = _run(toy_copy, 'bin/train.py', '--help')
  assert help_text.returncode == 0, help_text.stderr[-2000:]
  text = help_text.stdout
  assert 'toy' in _flag_block(text, 'algorithm')
  assert 'toy: sgd | sgdm' in ' '.join(_flag_block(text, 'client_optimizer').split())
  assert 'toy' in _flag_block(text, 'upload_compression').split('read by:')[1]
  # Validation: a client optimiser it does not take, named with the ones it does.
  refused = _run(toy_copy, 'bin/train.py', '--algorithm=toy', '--client_optimizer=adam',
                 f'--root_output_dir={toy_copy}/refused')
  assert refused.returncode == 2, refused.stderr[-2000:]
  last = refused.stderr.strip().splitlines()[-1]
  assert '--client_optimizer=adam' in last and '--algorithm=toy' in last, last
  assert 'sgd, sgdm' in last, last
  assert not os.path.exists(toy_copy / 'refused')
  # The README table generator has its row.
  table = _run(toy_copy, 'bin/algorithm_table.py')
  assert table.returncode == 0, table.stderr[-2000:]
  assert '| `toy` | a toy FedAvg | sgd, sgdm |' in table.stdout, table.stdout


def test_the_toy_algorithm_trains_a_round(toy_copy):
  """One round on digits through the composer, as a cohort (~30-60 s: TFF, one compiled round)."""
  trained = _run(toy_copy, 'bin/train.py', '--algorithm=toy', '--client_optimizer=sgdm',
                 '--task=digits', '--num_clients=4', '--clients_per_round=2',
                 '--client_batch_size=32', '--total_rounds=1', '--rounds_per_eval=1',
                 f'--root_output_dir={toy_copy}/out')
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert 'execution: cohort' in trained.stderr, trained.stderr[-3000:]
  runs = list((toy_copy / 'out').iterdir())
  assert len(runs) == 1 and runs[0].name.startswith('digits_toy')
  assert (runs[0] / 'metrics.csv').read_text().splitlines()[1].startswith('1,')
