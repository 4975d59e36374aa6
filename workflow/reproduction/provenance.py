"""Where each expected value of the reproduction report comes from, and the one rounding rule.

Every row (`Check`) says where its expected value comes from (`Source`):
printed in a seed (with the exact text, which tests/test_reproduction.py finds
in the seed file), printed but derived by the paper from other printed numbers
(FLOPs cells, "3.8x"), a statement without a number, SPEC (not a paper), the
package's own code (package vs package) or a figure only; and whether part of
"ours" holds by construction. `kind_of` sorts the rows into those kinds and
`summary` counts them; the report's headline is written from those counts.

One rounding rule (`printed_match`): ours is rounded half away from zero to
the last digit the seed prints (3 significant figures for the FLOPs tables,
which say so) and must then equal the printed value; "≈7" is read as 7.
"""

import dataclasses
import decimal
from typing import Optional

MATCH = '✓'
MISMATCH = '✗'
NOT_PRINTED = '—'  # The paper shows it only in a figure; ours is for reference.

# Where a row's expected value ("paper") comes from.
SEED = 'seed'  # printed in a seed text: `quote` is found there and contains `printed`
SPEC = 'spec'  # SPEC.md's number: no seed prints it
PACKAGE = 'package'  # the package's own code: package vs package, not a reproduction
FIGURE = 'figure'  # the seed shows it only in a figure: nothing to compare
SEED_FILES = {'000': '000_22d6bec094f51d4d.txt', '001': '001_0328705e8ea1b64a.txt',
              '002': '002_1b88dce68b95d942.txt', '003': '003_97b359ba18fb80dc.txt',
              '004': '004_cfa870f9da8f783f.txt'}

ROUNDING_RULE = ('✓ = ours rounded half away from zero to the last digit the paper prints '
                 '(to 3 significant figures in the FLOPs tables, which say so) equals the '
                 'printed value; "≈7" is read as 7')


@dataclasses.dataclass(frozen=True)
class Source:
  """Provenance of a row's expected value.

  kind: SEED, SPEC, PACKAGE or FIGURE.
  doc: the seed ('000' … '004'; '004' is the thesis) or 'SPEC'.
  quote: for SEED and SPEC, text of the document (whitespace-normalised) that
    prints the expected value; checked by tests/test_reproduction.py.
  printed: the printed values as they appear in `quote` ('' for a statement
    without a number, which is then counted as a statement, not a number).
  derived: for printed numbers that the paper computes from other printed
    numbers, how; such numbers are not independent evidence.
  """
  kind: str
  doc: str = ''
  quote: str = ''
  printed: tuple[str, ...] = ()
  derived: str = ''


@dataclasses.dataclass(frozen=True)
class Check:
  section: str
  item: str
  paper: str
  ours: str
  status: str  # MATCH, MISMATCH (then `note` explains) or NOT_PRINTED
  note: str = ''
  source: Source = Source(FIGURE)
  # The part of `ours` that is not measured but holds by construction ('' if none).
  construction: str = ''



def status(ok: bool) -> str:
  """MATCH or MISMATCH."""
  return MATCH if ok else MISMATCH


def _decimal(value: float) -> decimal.Decimal:
  return decimal.Decimal(repr(float(value)))


def round_like(value: float, printed: str, significant: Optional[int] = None) -> decimal.Decimal:
  """`value` rounded half away from zero to the precision of `printed`.

  The precision is the printed value's last digit, or `significant` figures
  when the source states them (2180 at 3 significant figures is 218e1).
  """
  d = _decimal(value)
  if significant is not None:
    if d == 0:
      return d
    places = significant - 1 - d.adjusted()
  else:
    digits = printed.replace(',', '')
    places = len(digits.split('.')[1]) if '.' in digits else 0
  return d.quantize(decimal.Decimal(1).scaleb(-places), rounding=decimal.ROUND_HALF_UP)


def printed_match(value: float, printed: str, significant: Optional[int] = None) -> bool:
  """The report's one rounding rule: ours, rounded like the print, equals the print."""
  return round_like(value, printed, significant) == decimal.Decimal(printed.replace(',', ''))


# Kinds of rows, in the order the headline lists them.
INDEPENDENT = 'independent'  # a number printed in a seed, not computed there from other prints
FLOPS = 'flops'  # a FLOPs table cell: printed, computed by the paper with eq. B.16
DERIVED = 'derived'  # another printed number the paper computes from printed ones
STATEMENT = 'statement'  # a printed statement without a number
SPEC_NUMBER = 'spec'
CONSTRUCTION = 'construction'  # part of ours holds by construction
PACKAGE_VS_PACKAGE = 'package'
FIGURE_ONLY = 'figure'
KINDS = (INDEPENDENT, FLOPS, DERIVED, STATEMENT, SPEC_NUMBER, CONSTRUCTION, PACKAGE_VS_PACKAGE,
         FIGURE_ONLY)


def kind_of(check: Check) -> str:
  src = check.source
  if src.kind == FIGURE:
    return FIGURE_ONLY
  if src.kind == PACKAGE:
    return PACKAGE_VS_PACKAGE
  if src.kind == SPEC:
    return SPEC_NUMBER
  if check.construction:
    return CONSTRUCTION
  if not src.printed:
    return STATEMENT
  if src.derived:
    return FLOPS if check.section.startswith('thesis Table B.') else DERIVED
  return INDEPENDENT


@dataclasses.dataclass(frozen=True)
class Tally:
  rows: int
  matched: int
  mismatched: int


def summary(sections: dict[str, list[Check]]) -> dict[str, Tally]:
  """Rows, ✓ and ✗ per kind (KINDS), over every section of `exact_checks`."""
  out = {}
  for kind in KINDS:
    rows = [c for checks in sections.values() for c in checks if kind_of(c) == kind]
    out[kind] = Tally(len(rows), sum(c.status == MATCH for c in rows),
                      sum(c.status == MISMATCH for c in rows))
  return out

