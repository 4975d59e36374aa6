"""The README's table of what each algorithm supports, generated from the registry.

`markdown()` renders `workflow.flags.algorithms.ALGORITHMS`; README.md holds its
output between `BEGIN` and `END` (bin/algorithm_table.py --write puts it
there, tests/test_algorithm_registry.py fails when the two differ), so the
table cannot drift from what bin/train validates.
"""

from workflow.flags import algorithms

BEGIN = ('<!-- BEGIN algorithm-table: generated from workflow/flags/algorithms.py by '
         'bin/algorithm_table.py --write; do not edit -->')
END = '<!-- END algorithm-table -->'
COLUMNS = ('`--algorithm`', 'in one line', '`--client_optimizer`', 'needs `--local_steps`',
           '`--aggregator`, `--dp`', '`--upload_compression`', '`--measure_client_drift`',
           '`--execution=cohort`', 'client state')


def _cell(text: str) -> str:
  return text.replace('|', '\\|')


def _yes_no(feature) -> str:
  return 'yes' if feature else 'no'


def _client_state(entry: algorithms.AlgorithmEntry) -> str:
  if entry.personalized:
    return 'private (personalised)'
  return 'kept by clients' if entry.keeps_client_state else ''


def row(name: str, entry: algorithms.AlgorithmEntry) -> list[str]:
  """The table's cells of one algorithm."""
  return [f'`{name}`', entry.doc, ', '.join(entry.client_optimizers),
          'yes' if entry.needs_local_steps else '', _yes_no(entry.aggregator),
          _yes_no(entry.compressible), _yes_no(entry.measures_client_drift),
          'yes' if entry.cohort else f'per client: {entry.cohort.why}', _client_state(entry)]


def markdown() -> str:
  """The table, one row per registered algorithm (registry order), ending in a newline."""
  lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  for name, entry in algorithms.ALGORITHMS.items():
    lines.append('| ' + ' | '.join(_cell(c) for c in row(name, entry)) + ' |')
  return '\n'.join(lines) + '\n'


def between_markers(text: str) -> str:
  """What `text` (README.md) holds between BEGIN and END (ValueError without them)."""
  if BEGIN not in text or END not in text:
    raise ValueError(f'no generated table: the text lacks {BEGIN!r} or {END!r}')
  return text.split(BEGIN, 1)[1].split(END, 1)[0].lstrip('\n')


def with_table(text: str) -> str:
  """`text` with the current table between its markers."""
  between_markers(text)  # the markers are there
  head, rest = text.split(BEGIN, 1)
  return f'{head}{BEGIN}\n{markdown()}{END}{rest.split(END, 1)[1]}'
