"""A bin/train flag is declared once: its entry in workflow/flags/train_flags.py.

The settings field, the value checks, the flag that names a library error
and --help all come from the entry, so adding a flag is its entry plus the
code that uses its value. Shown by planting one: a fresh interpreter (no
TensorFlow) runs the table's source with one more entry, and config,
validation, library_flags and --help know the new flag with nothing else
changed. The modules that derive from the table hold no flag names of their own.
"""

import ast
import os
import subprocess
import sys
import textwrap

from workflow.flags import train_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, 'workflow', 'flags', 'train_flags.py')
# The modules made from the table: a flag named here would be a second declaration.
DERIVED = ('workflow/flags/config.py', 'workflow/flags/validation.py',
           'workflow/flags/library_flags.py', 'workflow/flags/flag_checks.py')

ANCHOR = "        _f('fedprox_mu',"
PLANTED = ("        _f('planted_strength', 0.5, 'A planted flag.', ('fedprox',),\n"
           "           check=flag_checks.NON_NEGATIVE, feeds=(('planted', 'strength'),)),\n")

_PROBE = textwrap.dedent('''
    import sys
    sys.path.insert(0, {root!r})
    import workflow.flags
    source = open({table!r}, encoding='utf-8').read()
    assert source.count({anchor!r}) == 1
    table = type(sys)('workflow.flags.train_flags')
    table.__file__ = {table!r}
    sys.modules['workflow.flags.train_flags'] = workflow.flags.train_flags = table
    exec(compile(source.replace({anchor!r}, {planted!r} + {anchor!r}), {table!r}, 'exec'),
         table.__dict__)

    from tff_adaptive import errors as library_errors
    from workflow import errors
    from workflow.flags import config, library_flags, train_help, validation
    print('default', config.from_flags({{}}).algorithm.planted_strength)
    settings = config.from_flags({{'algorithm': 'fedprox', 'planted_strength': 2.0}})
    print('field', settings.algorithm.planted_strength, settings.flag_values()['planted_strength'])
    validation.validate(settings)
    try:
      validation.validate(settings.replace(planted_strength=-1.0))
    except errors.UsageError as e:
      print('refused', e)
    refusal = library_errors.ArgumentError('planted', 'strength', 'must be ≥ 0; got -1.0')
    print('named', library_flags.flag_message(refusal))
    print('help', '--planted_strength' in train_help.grouped_help())
    print('loaded', sorted(m for m in ('tensorflow', 'tensorflow_federated') if m in sys.modules))
''')


def test_a_new_flag_is_its_table_entry():
  probe = _PROBE.format(root=ROOT, table=TABLE, anchor=ANCHOR, planted=PLANTED)
  out = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.splitlines() == [
      'default 0.5',
      'field 2.0 2.0',
      'refused --planted_strength must be a non-negative number (>= 0); got -1.0',
      'named --planted_strength must be ≥ 0; got -1.0',
      'help True',
      'loaded []',
  ], out.stdout


def _flag_names_in(source: str, names) -> list[str]:
  """`line: 'name'` of each string literal of `source` that is a flag's name."""
  return [f'{node.lineno}: {node.value!r}' for node in ast.walk(ast.parse(source))
          if isinstance(node, ast.Constant) and node.value in names]


def test_the_derived_modules_name_no_flag():
  # A group key that is also a flag's name (task, algorithm, execution) names the group there.
  names = set(train_flags.FLAGS_BY_NAME) - {key for key, _, _ in train_flags.GROUPS}
  found = []
  for path in DERIVED:
    with open(os.path.join(ROOT, path), encoding='utf-8') as f:
      found += [f'{path}:{line}' for line in _flag_names_in(f.read(), names)]
  assert not found, ('a flag named outside its entry (derive it from workflow/flags/train_flags.py '
                     'instead):\n' + '\n'.join(found))
  # The scan sees a planted list of flags (the kind of table that used to live in validation).
  planted = "POSITIVE_FLOATS = ('client_learning_rate', 'fedprox_mu')\nx = 'fedprox'\n"
  assert _flag_names_in(planted, names) == ["1: 'client_learning_rate'", "1: 'fedprox_mu'"]


def test_each_library_argument_is_fed_by_one_flag():
  fed = [(key, f.name) for _, _, group in train_flags.GROUPS for f in group for key in f.feeds]
  keys = [key for key, _ in fed]
  assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
  assert dict(fed) == train_flags.ARGUMENT_FLAGS


def test_no_check_refuses_an_unset_flag_or_its_default():
  for name, flag in train_flags.FLAGS_BY_NAME.items():
    for check in flag.checks:
      assert check.problem(name, None) is None  # an unset flag is never refused
      assert check.problem(name, flag.default) is None, name  # nor its default
  assert train_flags.FLAGS_BY_NAME['seed'].checks[1].problem('seed', 2**32) == (
      '--seed must be in [0, 4294967295]; got 4294967296')


def test_a_fraction_of_clients_is_below_one():
  check, = train_flags.FLAGS_BY_NAME['noisy_client_fraction'].checks
  assert check.problem('noisy_client_fraction', 0.5) is None
  assert check.problem('noisy_client_fraction', 1.0) == (
      '--noisy_client_fraction must be in [0, 1); got 1.0')
