"""Every figure of the five source papers that can be checked without their datasets.

Each check recomputes a published number with the package's own code and
puts the paper's value next to ours (SPEC §10 settles the papers' errata):

  * seed 001 Table 1, "fraction SGD steps used" by decaying K over 4000
    rounds, its "3.8x" and the quadratic toy's "84% less" (`schedules`);
  * thesis Table 5.4, K_r-rounds' relative SGD steps, through the runtime
    model of thesis eqs. 5.3-5.5 (`runtime_model.simulated_round_seconds`);
  * seed 000 Tables 4/10 = thesis Tables B.2/B.3, FLOPs per client per round
    (`accounting.flops` on the package's Keras models);
  * thesis eqs. 3.1-3.4: Golomb b*, g_s, nominal compression ratios, and a
    real encoded upload's size (`compression`);
  * seed 001 §3: the quadratic toy's true minimiser and FedSGD fixed points
    (`quadratic_toy.fixed_point`, `quadratic_toy.simulate_fedsgd`);
  * thesis Table 6.2 (= seed 000 Table 2) and seed 002's table in App. G.4:
    download, upload and client memory, read from the cost metrics of real
    learning processes built by the algorithm registry (one round on
    `digits`), whose bits are measured from TFF types.

Every row says where its expected value comes from (`Source`): printed in a
seed (with the exact text, which tests/test_reproduction.py finds in the
seed file), printed but derived by the paper from other printed numbers
(FLOPs cells, "3.8x"), a statement without a number, SPEC (not a paper),
the package's own code (package vs package) or a figure only; and whether
part of "ours" holds by construction. `summary` counts each kind and the
headline of reports/reproduction.md is written from those counts.

One rounding rule (`printed_match`): ours is rounded half away from zero to
the last digit the seed prints (3 significant figures for the FLOPs tables,
which say so) and must then equal the printed value; "≈7" is read as 7.

`exact_checks()` returns the rows by section; `flops_table_markdown` renders
the FLOPs tables cell by cell. bin/report.py --reproduction writes them, with
the qualitative sweep, to reports/reproduction.md.
"""

import dataclasses
import decimal
import math
import re
from collections.abc import Callable, Sequence
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

ROUNDING_RULE = ('✓ = ours rounded half away from zero to the last digit the seed prints '
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


def _normalise(text: str) -> str:
  return ' '.join(text.split())


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


# ---------------------------------------------------------------------------
# Seed 001: decaying K.

# Table 1, "Fraction SGD Steps Used" over 4000 rounds; d_K from Table 5. FEMNIST's
# third column is K = 33 (Table 1; Table 5 misprints 100, SPEC §10).
SEED001_TABLE1 = (
    ('StackOverflow', 10, 0.9996, '0.55'), ('StackOverflow', 33, 0.9996, '0.51'),
    ('StackOverflow', 100, 0.9996, '0.50'), ('FEMNIST', 3, 0.9996, '0.65'),
    ('FEMNIST', 10, 0.9996, '0.55'), ('FEMNIST', 33, 0.999, '0.26'),
    ('Shakespeare', 10, 0.9996, '0.55'), ('Shakespeare', 33, 0.9996, '0.51'),
    ('Shakespeare', 100, 0.9996, '0.50'),
)


_TABLE1_QUOTE = 'Fraction SGD Steps Used 0.55 0.51 0.50 0.65 0.55 0.26 0.55 0.51 0.50'


def _exp_k(k0: int, decay: float):
  """Seed 001's K_t = ⌈K_0 d^t⌉."""
  from tff_adaptive.schedules import core as schedules  # pylint: disable=g-import-not-at-top
  from tff_adaptive.schedules import learning_rate  # pylint: disable=g-import-not-at-top
  return learning_rate.ExponentialDecay(k0, decay, quantity=schedules.LOCAL_STEPS)


def seed001_step_fractions() -> list[Check]:
  from tff_adaptive.schedules import local_steps  # pylint: disable=g-import-not-at-top
  rows = []
  fractions = {}
  for task, k0, decay, paper in SEED001_TABLE1:
    ks = local_steps.local_steps_sequence(_exp_k(k0, decay), 4000)
    f = local_steps.step_fraction(ks, k0)
    fractions[(task, k0)] = f
    rows.append(Check('seed 001 Table 1', f'{task}, K_0 = {k0}, d_K = {decay}', paper,
                      f'{f:.4f}', MATCH if printed_match(f, paper) else MISMATCH,
                      source=Source(SEED, '001', _TABLE1_QUOTE, (paper,))))
  speedup = 1.0 / fractions[('FEMNIST', 33)]
  rows.append(Check('seed 001 abstract', 'up to "3.8x" fewer SGD steps (FEMNIST K = 33)', '3.8',
                    f'{speedup:.3f}', MATCH if printed_match(speedup, '3.8') else MISMATCH,
                    source=Source(SEED, '001', 'with up to $3.8\\times$ less total steps of SGD',
                                  ('3.8',), derived='1 / 0.26, the FEMNIST K_0 = 33 fraction '
                                  'of Table 1 (row above)')))
  ks = local_steps.local_steps_sequence(_exp_k(10, 0.995), 3000)
  saved = 100 * (1.0 - local_steps.step_fraction(ks, 10))
  ok = printed_match(saved, '84')
  rows.append(Check('seed 001 §3', 'quadratic toy: d_K = 0.995 vs constant K = 10 over 3000 '
                    'rounds, "84% less total SGD steps"', '84%', f'{saved:.1f}%',
                    MATCH if ok else MISMATCH,
                    '' if ok else (f'{saved:.2f}% rounds to {round_like(saved, "84")}%; the '
                                   f'printed 84% is {saved:.1f}% truncated'),
                    source=Source(SEED, '001', 'perform 84% less total SGD steps compared to '
                                  'clients with constant $K = 10$ over 3000 rounds', ('84%',))))
  return rows


# ---------------------------------------------------------------------------
# Thesis Table 5.4: relative SGD steps of K_r-rounds.

# Table 5.1 (model size in Mbit, K_0) and Table 5.2 (β, seconds per minibatch
# on a Raspberry Pi 3B+); D = 20, U = 5 Mbit/s (§5.2.2).
THESIS_TASKS = {'Sentiment 140': (0.32, 60, 5.2e-3, '0.21'),
                'FEMNIST': (6.71, 80, 0.017, '0.11'),
                'CIFAR100': (40.0, 50, 0.31, '0.090'),
                'Shakespeare': (5.21, 80, 1.5, '0.74')}


def relative_steps_same_runtime(model_mbit: float, k0: int, beta: float,
                                rounds: int = 10_000) -> tuple[float, float]:
  """K_r-rounds' SGD steps in the simulated time of `rounds` Kη-fixed rounds.

  Returns (fraction within the same simulated runtime, fraction over the
  same number of rounds).
  """
  from tff_adaptive.accounting import runtime_model  # pylint: disable=g-import-not-at-top
  from tff_adaptive.schedules import core as schedules  # pylint: disable=g-import-not-at-top
  from tff_adaptive.schedules import local_steps  # pylint: disable=g-import-not-at-top
  num_params = model_mbit * 1e6 / runtime_model.BITS_PER_FLOAT
  seconds = {}

  def round_seconds(k):
    if k not in seconds:
      seconds[k] = runtime_model.simulated_round_seconds(num_params, k, beta)
    return seconds[k]

  budget = rounds * round_seconds(k0)
  schedule = local_steps.RoundsDecay(k0, schedules.LOCAL_STEPS)

  def segment_end(t: int) -> int:
    """Last round t' >= t with K_t' = K_t (K_r is non-increasing: bisect)."""
    k, step = schedule.value(t), 1
    while schedule.value(t + step) == k:
      if step >= 1 << 40:  # K stays (K_r = 1 from r = K_0^3 on)
        return t + step
      step *= 2
    lo, hi = t + step // 2, t + step  # value(lo) == k != value(hi)
    while hi - lo > 1:
      mid = (lo + hi) // 2
      lo, hi = (mid, hi) if schedule.value(mid) == k else (lo, mid)
    return lo

  # Rounds run in segments of constant K (a few dozen of them), not one by one:
  # Shakespeare fits ~250k K_r-rounds rounds into the time of 10k fixed ones.
  elapsed, steps, steps_in_rounds, t = 0.0, 0, 0, 0
  while True:
    k, end = schedule.value(t), segment_end(t)
    length = end - t + 1
    steps_in_rounds += k * max(0, min(end + 1, rounds) - t)
    n = min(length, int((budget - elapsed) // round_seconds(k)))
    elapsed += n * round_seconds(k)
    steps += n * k
    t += n
    if n < length:  # The budget ends inside this segment.
      break
  return steps / (rounds * k0), steps_in_rounds / (rounds * k0)


def thesis_table_5_4() -> list[Check]:
  rows = []
  for task, (mbit, k0, beta, paper) in THESIS_TASKS.items():
    same_time, same_rounds = relative_steps_same_runtime(mbit, k0, beta)
    ok = printed_match(same_time, paper)
    note = ('steps within the simulated runtime of 10k Kη-fixed rounds (the reading that '
            'reproduces the other three tasks)')
    if not ok:
      note = (f'not reproduced: neither within the runtime of 10k Kη-fixed rounds '
              f'({same_time:.3f}) nor over 10k rounds ({same_rounds:.3f}) gives {paper}, and '
              'the thesis states no other setting in which CIFAR100 differs')
    rows.append(Check('thesis Table 5.4', f'K_r-rounds, {task} (K_0 = {k0}, {mbit} Mbit, '
                      f'β = {beta} s)', paper, f'{same_time:.3f}', MATCH if ok else MISMATCH,
                      note, Source(SEED, '004', 'K_r -rounds 0.21 0.11 0.090 0.74', (paper,))))
  return rows


# ---------------------------------------------------------------------------
# FLOPs: seed 000 Tables 4 and 10 = thesis Tables B.2 and B.3.

OPTIMIZERS = ('rmsprop', 'sgdm', 'adam')
# Per task: rows FedGBO, Mimelite, MFL (RMSProp, SGDm, Adam), then SGD, FedProx (×1e8).
FLOPS_TABLES = {
    10: {'CIFAR100': ([50.2, 50.2, 50.6], [65.7, 65.7, 66.1], [50.2, 50.6, 50.9], 49.8, 50.2),
         'Sent140': ([0.0290, 0.0290, 0.0320], [0.0350, 0.0350, 0.0365],
                     [0.0290, 0.0320, 0.0350], 0.0260, 0.0290),
         'FEMNIST': ([32.2, 32.2, 32.4], [49.0, 49.0, 49.3], [32.2, 32.4, 32.7], 31.9, 32.2),
         'Shakespeare': ([118] * 3, [2180] * 3, [118] * 3, 118, 118)},
    50: {'CIFAR100': ([251, 251, 253], [266, 266, 268], [251, 253, 255], 249, 251),
         'Sent140': ([0.145, 0.145, 0.160], [0.150, 0.150, 0.165], [0.145, 0.160, 0.175],
                     0.130, 0.145),
         'FEMNIST': ([161, 161, 162], [178, 178, 179], [161, 162, 163], 160, 161),
         'Shakespeare': ([592] * 3, [2650] * 3, [592] * 3, 591, 592)},
}
# Batch size B (Appendix B) and mean samples per client n (seed 000 Table 3).
FLOPS_TASKS = {'CIFAR100': (32, 100), 'Sent140': (8, 15), 'FEMNIST': (32, 170),
               'Shakespeare': (32, 5573)}
_SENT140_ERRATUM = ('eq. B.16 with n = 15 (which the Adam cell 0.0365 and Table B.3 imply) '
                    'gives 0.0335; the printed 0.0350 is inconsistent')


def flops_models() -> dict:
  """Keras models of the four tasks: the package's CNNs and seed 000's Sent140/Shakespeare."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tasks.models import paper_cnns  # pylint: disable=g-import-not-at-top
  layers = tf.keras.layers
  # Seed 000 Appendix B: Sent140 is a linear model on a 5k bag of words (2
  # classes); Shakespeare embeds 79 characters in 8 dimensions, two GRU-128,
  # a dense output over 79 characters, LEAF's 80-character sequences.
  sent140 = tf.keras.Sequential([layers.InputLayer(input_shape=(5000,)), layers.Dense(2)])
  shakespeare = tf.keras.Sequential([
      layers.InputLayer(input_shape=(80,), dtype='int32'), layers.Embedding(79, 8),
      layers.GRU(128, return_sequences=True), layers.GRU(128), layers.Dense(79)])
  return {'CIFAR100': paper_cnns.create_cifar100_cnn(),
          'Sent140': sent140,
          'FEMNIST': paper_cnns.create_femnist_cnn(),
          'Shakespeare': shakespeare}


@dataclasses.dataclass(frozen=True)
class FlopsCell:
  k: int
  task: str
  algorithm: str  # fedgbo | mimelite | mfl | sgd | fedprox
  optimizer: Optional[str]
  paper: float
  exact: float  # ×1e8, eq. B.16 on our models

  @property
  def ours(self) -> float:
    """×1e8 to 3 significant figures (the report's rounding rule)."""
    return float(round_like(self.exact, '', significant=3))

  @property
  def matches(self) -> bool:
    return printed_match(self.exact, _sig3(self.paper), significant=3)


def flops_cells(models: Optional[dict] = None) -> list[FlopsCell]:
  from tff_adaptive.accounting import flops  # pylint: disable=g-import-not-at-top
  models = models or flops_models()
  counts = {task: flops.model_counts(m) for task, m in models.items()}
  cells = []
  for k, table in FLOPS_TABLES.items():
    for task, (fedgbo, mimelite, mfl, sgd, fedprox) in table.items():
      batch, n_i = FLOPS_TASKS[task]

      def exact(algorithm, optimizer=None, **kw):
        return flops.client_flops(algorithm, optimizer, counts[task], K=k, B=batch, **kw) / 1e8

      for name, row, extra in (('fedgbo', fedgbo, {}), ('mimelite', mimelite, {'n_i': n_i}),
                               ('mfl', mfl, {})):
        for opt, paper in zip(OPTIMIZERS, row):
          cells.append(FlopsCell(k, task, name, opt, paper, exact(name, opt, **extra)))
      cells.append(FlopsCell(k, task, 'sgd', None, sgd, exact('fedavg')))
      cells.append(FlopsCell(k, task, 'fedprox', None, fedprox, exact('fedprox')))
  return cells


def _cell_note(cell: FlopsCell) -> str:
  if cell.task == 'Sent140' and cell.k == 10 and cell.algorithm == 'mimelite' and (
      cell.optimizer in ('rmsprop', 'sgdm')):
    return _SENT140_ERRATUM
  return ''


# Seed 000's Table 10 prints Shakespeare's FedGBO and MFL rows as "- 592 592 592"; the
# thesis' Table B.3 text lost the MFL row, so those three cells are quoted from seed 000.
_SEED000_TABLE10_SHAKESPEARE = '- 592 592 592 Shakespeare 2650 2650 2650 591 - 592 592 592'
FLOPS_QUANTITIES = ('|x|', 'forward FLOPs per example', 'n (mean samples per client)')


def _flops_source(cell: FlopsCell) -> Source:
  """The task's block of thesis Table B.2/B.3 as printed (seed 000 Table 10 for one row)."""
  fedgbo, mimelite, mfl, sgd, fedprox = FLOPS_TABLES[cell.k][cell.task]
  derived = (f'eq. B.16 from the task\'s {", ".join(FLOPS_QUANTITIES)}; B and K are settings')
  if cell.k == 50 and cell.algorithm != 'mimelite':
    derived += ' (= 5 × its K = 10 cell before rounding)'
  printed = (_sig3(cell.paper),)
  if cell.k == 50 and cell.task == 'Shakespeare' and cell.algorithm == 'mfl':
    return Source(SEED, '000', _SEED000_TABLE10_SHAKESPEARE, printed, derived)
  rows = [fedgbo, [sgd, fedprox], mimelite]
  if not (cell.k == 50 and cell.task == 'Shakespeare'):
    rows.append(mfl)
  quote = ' '.join([cell.task] + [_sig3(v) for row in rows for v in row])
  return Source(SEED, '004', quote, printed, derived)


def flops_checks(cells: Sequence[FlopsCell]) -> list[Check]:
  rows = []
  for c in cells:
    note = _cell_note(c)
    rows.append(Check(f'thesis Table B.{2 if c.k == 10 else 3} (seed 000 Table '
                      f'{4 if c.k == 10 else 10})',
                      f'{c.task}, {c.algorithm}{"-" + c.optimizer if c.optimizer else ""}, '
                      f'K = {c.k}', _sig3(c.paper), _sig3(c.ours),
                      MATCH if c.matches else MISMATCH, note, _flops_source(c)))
  return rows


def _sig3(x: float) -> str:
  """Three significant figures as the tables print them (0.0290, 49.0, 2180)."""
  return f'{x:.0f}' if abs(x) >= 100 else f'{x:#.3g}'.rstrip('.')


def flops_table_markdown(cells: Sequence[FlopsCell], k: int) -> str:
  """Thesis Table B.2 / B.3 layout, each cell 'paper / ours ✓'."""
  head = '| task | algorithm | RMSProp | SGDm | Adam | SGD (FedAvg, AdaptiveFedOpt) | FedProx |'
  lines = [head, '|---|---|---|---|---|---|---|']

  def fmt(c):
    if c is None:
      return ''
    mark = MATCH if c.matches else MISMATCH + '¹'
    return f'{_sig3(c.paper)} / {_sig3(c.ours)} {mark}'

  by_key = {(c.task, c.algorithm, c.optimizer): c for c in cells if c.k == k}
  for task in FLOPS_TASKS:
    for i, alg in enumerate(('fedgbo', 'mimelite', 'mfl')):
      row = [task if i == 0 else '', {'fedgbo': 'FedGBO', 'mimelite': 'Mimelite',
                                       'mfl': 'MFL'}[alg]]
      row += [fmt(by_key.get((task, alg, opt))) for opt in OPTIMIZERS]
      row += ([fmt(by_key.get((task, 'sgd', None))), fmt(by_key.get((task, 'fedprox', None)))]
              if i == 0 else ['', ''])
      lines.append('| ' + ' | '.join(row) + ' |')
  return '\n'.join(lines)


_SPEC_CNN_QUOTE = ("Check: seed 000's CIFAR100 CNN (|x| = 1,250,852, forward 5,163,072 per "
                   "example)")


def model_size_checks(models: Optional[dict] = None) -> list[Check]:
  """SPEC §8's check numbers for seed 000's CIFAR100 CNN (seed 000 gives only its layers)."""
  from tff_adaptive.accounting import flops  # pylint: disable=g-import-not-at-top
  models = models or flops_models()
  counts = flops.model_counts(models['CIFAR100'])
  note = ('SPEC\'s number, not printed in any seed: seed 000 App. B gives the architecture '
          '(conv3×3·32, pool, conv3×3·64, pool, FC512, FC100), from which SPEC computed it')
  return [
      Check('SPEC §8', 'CIFAR100 CNN |x| (trainable parameters)',
            '1,250,852', f'{counts.num_params:,}',
            MATCH if counts.num_params == 1_250_852 else MISMATCH, note,
            Source(SPEC, 'SPEC', _SPEC_CNN_QUOTE, ('1,250,852',))),
      Check('SPEC §8', 'CIFAR100 CNN forward FLOPs per example',
            '5,163,072', f'{counts.forward_flops:,}',
            MATCH if counts.forward_flops == 5_163_072 else MISMATCH, note,
            Source(SPEC, 'SPEC', _SPEC_CNN_QUOTE, ('5,163,072',))),
  ]


# ---------------------------------------------------------------------------
# Thesis ch. 3: compression.

_GOLOMB_QUOTE = 'b^* = 1 + \\lfloor \\log_2 \\left(\\frac{\\phi - 1}{s} \\right) \\rfloor'
# Thesis §3.3.2: "s = {0.6, 0.9, 0.95} provides approximately {7, 25, 53}x compression
# for FedAvg, and approximately {9, 33, 68}x for CE-FedAvg".
_RATIO_QUOTES = {'fedavg': 'Sparsity rates of $s = \\{0.6, 0.9, 0.95\\}$ provides approximately '
                           '$\\{7, 25, 53\\} \\times$ compression for',
                 'ce': 'and approximately $\\{9, 33, 68\\} \\times$ compression for CE-FedAvg'}
_PRINTED_RATIOS = {('fedavg', 0.6): '7', ('fedavg', 0.9): '25', ('fedavg', 0.95): '53',
                   ('ce', 0.6): '9', ('ce', 0.9): '33', ('ce', 0.95): '68'}
_SPEC_RATIOS = {0.6: '7.62× / 9.06×', 0.9: '25.09× / 33.38×'}  # SPEC §6: our values, not printed


def _printed_golomb(s: float) -> tuple[int, float]:
  """The thesis' eq. 3.4 as printed, b* = 1 + ⌊log2((φ−1)/s)⌋, and eq. 3.3's g_s with it."""
  b = max(0, 1 + math.floor(math.log2((math.sqrt(5) - 1) / 2 / s)))
  return b, b + 1 / (1 - s ** (2 ** b))


def index_entropy_bits(s: float) -> float:
  """Bits per kept index that no lossless code beats: H(s)/(1 − s) (random (1−s) mask)."""
  return -(s * math.log2(s) + (1 - s) * math.log2(1 - s)) / (1 - s)


def _g_range(printed: str, s: float, fedavg: bool) -> tuple[float, float]:
  """g_s for which eq. 3.1 (3.2) without |W| rounds to the printed integer ratio."""
  bits, code = (32, 8) if fedavg else (96, 24)
  lo, hi = float(printed) - 0.5, float(printed) + 0.5
  return bits / ((1 - s) * hi) - code, bits / ((1 - s) * lo) - code


def compression_checks() -> list[Check]:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tff_adaptive import compression  # pylint: disable=g-import-not-at-top
  g = compression.golomb_expected_bits
  rows = []
  for s in (0.6, 0.9, 0.95):
    b, gp = _printed_golomb(s)
    rows.append(Check('thesis eqs. 3.3-3.4', f'Golomb b*, g_s at s = {s}', '(Figure 3.2 only)',
                      f'b* = {compression.golomb_b_star(s)}, g_s = {g(s):.3f}', NOT_PRINTED,
                      f'SPEC §10\'s b* = 1 + ⌊log2(ln(φ−1)/ln s)⌋; the printed eq. 3.4, '
                      f'1 + ⌊log2((φ−1)/s)⌋, gives b* = {b} and g_s = {gp:.3f} here',
                      Source(FIGURE, '004', _GOLOMB_QUOTE)))
  for (which, s), printed in _PRINTED_RATIOS.items():
    fedavg = which == 'fedavg'
    ratio = (compression.nominal_compression_ratio_fedavg(s) if fedavg
             else compression.nominal_compression_ratio_ce_fedavg(s))
    name = 'FedAvg (eq. 3.1)' if fedavg else 'CE-FedAvg (eq. 3.2)'
    ok = printed_match(ratio, printed)
    lo, hi = _g_range(printed, s, fedavg)
    note = ''
    if s in _SPEC_RATIOS and fedavg:
      note = (f'SPEC §6\'s {_SPEC_RATIOS[s]} are these eqs.\' values, not printed numbers. ')
    if not ok and s != 0.95:
      note += (f'{ratio:.2f} rounds to {round_like(ratio, printed)}; ≈{printed}× needs '
               f'{lo:.2f} ≤ g_s ≤ {hi:.2f} bits per index, Golomb gives {g(s):.2f} '
               f'(the entropy bound is {index_entropy_bits(s):.2f})')
    elif not ok:
      other = 'ce' if fedavg else 'fedavg'
      lo2, hi2 = _g_range(_PRINTED_RATIOS[(other, s)], s, not fedavg)
      note += (f'eqs. 3.1-3.3 give {ratio:.1f}×. One g_s gives both printed ratios (≈53× and '
               f'≈68× need {max(lo, lo2):.2f} ≤ g_s ≤ {min(hi, hi2):.2f} bits per index, e.g. '
               f'4.1 → {32 / (0.05 * 12.1):.1f}× and {96 / (0.05 * 28.1):.1f}×), but no lossless '
               'index code beats the entropy bound H(s)/(1 − s) = '
               f'{index_entropy_bits(s):.2f} bits per index at s = {s} (Golomb: {g(s):.2f}), so '
               'the printed s = 0.95 ratios are out of reach of eqs. 3.1-3.2')
    rows.append(Check('thesis §3.3.2', f'nominal ratio {name}, s = {s}', f'≈{printed}×',
                      f'{ratio:.2f}×', MATCH if ok else MISMATCH, note.strip(),
                      Source(SEED, '004', _RATIO_QUOTES[which], (printed,))))
  per_round = {s: (24 + g(s)) / (8 + g(s)) for s in (0.5, 0.6, 0.9, 0.95, 0.99)}
  at_rates = [per_round[s] for s in (0.6, 0.9, 0.95)]
  ok = all(printed_match(r, '2.3') for r in at_rates)
  rows.append(Check('thesis §3.3.2', 'FedAvg : CE-FedAvg upload per round at s = 0.6, 0.9, 0.95',
                    '≈ 1 : 2.3', ' / '.join(f'{r:.2f}' for r in at_rates),
                    MATCH if ok else MISMATCH,
                    '' if ok else (
                        'only s = 0.9 rounds to 2.3 (' + ', '.join(
                            f'{r:.2f} → {round_like(r, "2.3")}' for r in at_rates) +
                        '); the printed 2.3 follows from the printed ratios (3·7/9 = 2.33, '
                        '3·25/33 = 2.27, 3·53/68 = 2.34)'),
                    Source(SEED, '004', 'uploaded data ratio per round of $\\approx 1 : 2.3$',
                           ('2.3',), derived='3 × the printed FedAvg ratio / the printed '
                           'CE-FedAvg ratio (rows above)')))
  rows.append(Check('thesis §3.2', 'CE-FedAvg : FedAvg upload per round over 0.5 ≤ s < 1',
                    '2.6 – 2', f'{per_round[0.5]:.2f} (s = 0.5) … {per_round[0.99]:.2f} '
                    '(s = 0.99)', MATCH if (printed_match(per_round[0.5], '2.6') and
                                            printed_match(per_round[0.99], '2')) else MISMATCH,
                    source=Source(SEED, '004', 'between $2.6 - 2\\times$ that of FedAvg for '
                                  '$0.5 \\leq s < 1.0$', ('2.6', '2'))))
  # A real upload: sparsify, quantise, Golomb-code, and count the bits.
  rng = np.random.default_rng(0)
  shapes = [(784, 200), (200,), (200, 200), (200,), (200, 10), (10,)]  # thesis MNIST-2NN
  weights = [rng.normal(size=sh).astype(np.float32) for sh in shapes]
  moments = [rng.normal(size=sh).astype(np.float32) * 1e-2 for sh in shapes]
  second = [np.abs(rng.normal(size=sh)).astype(np.float32) * 1e-6 for sh in shapes]
  num_params = sum(w.size for w in weights)
  for s in (0.6, 0.9):
    fedavg = compression.encode_upload(weights, s, True).num_bits
    ce = compression.encode_upload(weights, s, True, [moments, second]).num_bits
    a_fedavg = compression.analytic_bits_fedavg(num_params, len(shapes), s)
    a_ce = compression.analytic_bits_ce_fedavg(num_params, len(shapes), s)
    close = abs(fedavg / a_fedavg - 1) < 0.03 and abs(ce / a_ce - 1) < 0.03
    rows.append(Check('thesis eqs. 3.1-3.2',
                      f'encoded MNIST-2NN upload (|x| = {num_params:,}, '
                      f's = {s}): FedAvg / CE-FedAvg bits',
                      f'{a_fedavg:,.0f} / {a_ce:,.0f} (our eqs. 3.1-3.2)',
                      f'{fedavg:,} / {ce:,} (measured)', MATCH if close else MISMATCH,
                      'no published number: the package\'s encoder (real Golomb code lengths) '
                      'against the package\'s own `analytic_bits_*` (within 3%); rank-1 '
                      'tensors are sent dense, which the formulas ignore',
                      Source(PACKAGE, 'compression.analytic_bits_fedavg / '
                             'analytic_bits_ce_fedavg')))
  return rows


# ---------------------------------------------------------------------------
# Seed 001 §3: the quadratic toy.

def quadratic_checks() -> list[Check]:
  from tff_adaptive.schedules import quadratic_toy  # pylint: disable=g-import-not-at-top
  x_star = quadratic_toy.TRUE_MINIMISER
  rows = [Check('seed 001 §3',
                'true minimiser x* of E_z[½zx² − x], p(z) ∝ z^(−1/2) on [1, 3]', '≈ 0.523',
                f'{x_star:.6f}', MATCH if printed_match(x_star, '0.523') else MISMATCH,
                'closed form 3(√3 − 1)/(3√3 − 1)',
                Source(SEED, '001', '$f(x)$ is minimised by $x^* \\approx 0.523$', ('0.523',)))]
  previous = None
  for k in (1, 2, 5, 10, 20, 50):
    fixed = quadratic_toy.fixed_point(0.1, k)
    simulated = quadratic_toy.simulate_fedsgd(k, 400, gamma=0.1, server_lr=1.0)[-1]
    ours = (f'{fixed:.6f} (|x̃* − x*| = {abs(fixed - x_star):.4f}); '
            f'simulated FedSGD: {simulated:.6f}')
    item = f'FedSGD fixed point x̃*(γ = 0.1, K = {k})'
    if k == 1:
      rows.append(Check('seed 001 eq. 7 / Figure 1(a)', item,
                        'x̃* = x* at K = 1 (FedSGD becomes distributed SGD); |x̃* − x*| '
                        'increases with K', ours,
                        MATCH if abs(fixed - x_star) < 1e-12 else MISMATCH,
                        'a statement, no number; Gauss-Legendre on the closed form; the '
                        'simulation runs 400 rounds of explicit client GD steps on 1000 clients',
                        Source(SEED, '001', '$\\|x^*(\\gamma, K) - x^*\\|$ increases with K')))
    else:
      grows = fixed > previous
      rows.append(Check('seed 001 eq. 7 / Figure 1(a)', item, '(Figure 1(a) only)', ours,
                        NOT_PRINTED if grows else MISMATCH,
                        'grows with K, as the paper says' if grows else 'does not grow with K',
                        Source(FIGURE, '001')))
    previous = fixed
  decaying = quadratic_toy.simulate_fedsgd(_exp_k(10, 0.995), 3000, gamma=0.1)[-1]
  constant = quadratic_toy.simulate_fedsgd(10, 3000, gamma=0.1)[-1]
  ok = abs(decaying - x_star) < 1e-6 < abs(constant - x_star)
  rows.append(Check('seed 001 Figure 1(b)', 'after 3000 rounds: constant K = 10 vs d_K = 0.995',
                    'decaying K reaches x*, constant K stays at x̃*(γ, 10)',
                    f'|x − x*| = {abs(constant - x_star):.4f} vs {abs(decaying - x_star):.1e}',
                    MATCH if ok else MISMATCH,
                    'a statement, no number; full participation, server lr 1 (the paper samples '
                    '10 clients with η = 0.001: same fixed points, slower)',
                    Source(SEED, '001', 'A decay rate of $d_K = 0.995$ is a good choice here due '
                           'to fastest convergence to x^*')))
  return rows


# ---------------------------------------------------------------------------
# Communication and memory from real processes.

@dataclasses.dataclass(frozen=True)
class ProcessCost:
  label: str
  down_bits: float
  up_bits: float
  state_floats: float
  num_params: int

  def floats(self, bits: float) -> tuple[int, float]:
    """(k, rest): bits = k·32|x| + rest bits."""
    k = int(bits // (32 * self.num_params))
    return k, bits - k * 32 * self.num_params

  def describe(self, bits: float) -> str:
    k, rest = self.floats(bits)
    return f'{k}|x|' + (f' + {rest:.0f} b' if rest else '')


# label -> bin/train flags of the process.
PROCESSES = {
    'FedAvg': dict(algorithm='fedavg', client_optimizer='sgd'),
    'FedAdam (FedOpt / AdaptiveFedOpt)': dict(algorithm='fedadam', client_optimizer='sgd',
                                              server_learning_rate=0.01),
    'FedAdaGrad': dict(algorithm='fedadagrad', client_optimizer='sgd', server_learning_rate=0.01),
    'FedProx': dict(algorithm='fedprox', client_optimizer='sgd'),
    'FedMAX': dict(algorithm='fedmax', client_optimizer='sgd'),
    'MFL-SGDm': dict(algorithm='mfl', client_optimizer='sgdm'),
    'MFL-Adam': dict(algorithm='mfl', client_optimizer='adam'),
    'Mimelite-SGDm': dict(algorithm='mimelite', client_optimizer='sgdm'),
    'Mimelite-Adam': dict(algorithm='mimelite', client_optimizer='adam'),
    'FedGBO-SGDm': dict(algorithm='fedgbo', client_optimizer='sgdm'),
    'FedGBO-Adam': dict(algorithm='fedgbo', client_optimizer='adam'),
    'DJA (AdaGrad-AdaGrad)': dict(algorithm='fedada2', client_optimizer='adagrad',
                                  preconditioner='dja', server_optimizer='adagrad',
                                  server_learning_rate=0.01),
    'FedAda2 (SM3-AdaGrad)': dict(algorithm='fedada2', client_optimizer='sm3_adagrad',
                                  preconditioner='none', server_optimizer='adagrad',
                                  server_learning_rate=0.01),
}
COST_LOCAL_STEPS = 2


def measure_process_costs(
    labels: Optional[Sequence[str]] = None,
    progress: Callable[[str], None] = lambda m: None) -> dict[str, ProcessCost]:
  """One round of each process on `digits` (MLP, IID, 2 clients); its cost metrics."""
  from tasks import digits  # pylint: disable=g-import-not-at-top
  from workflow import program  # pylint: disable=g-import-not-at-top
  from tff_adaptive.algorithms import composer  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  from workflow import algorithms as registry  # pylint: disable=g-import-not-at-top
  runtime.use_local_cpp_context()
  task = digits.create_task(partition='iid', num_clients=4, model='mlp', batch_size=10)
  num_params = int(sum(int(w.shape.num_elements())
                       for w in task.keras_model_fn().trainable_weights))
  ids = list(task.train_data.client_ids)[:2]
  out = {}
  try:
    for label in labels or PROCESSES:
      progress(label)
      cfg = dict(PROCESSES[label], client_learning_rate=0.01, local_steps=COST_LOCAL_STEPS,
                 clients_per_round=2)
      process = registry.build(cfg['algorithm'], task, cfg)
      state = process.initialize()
      steps = None if composer.runs_local_steps(state) else COST_LOCAL_STEPS
      cost = process.next(state, program.client_datasets(task, ids, steps)).metrics['cost']
      out[label] = ProcessCost(label, float(cost['download_bits_per_client']),
                               float(cost['upload_bits_per_client']),
                               float(cost['client_optimizer_state_floats']), num_params)
  finally:
    runtime.shutdown_workers()
  return out


# Thesis Table 6.2 (= seed 000 Table 2, which its extracted text lacks): the row as
# printed, then down and up in floats of |x|. The table prints symbols (x; x, s;
# x, ∇f); the multiples use |s| = |x| for SGDm and RMSProp and 2|x| for Adam (seed 000
# §4: "for RMSProp and SGDm, the total download cost is doubled, and tripled for Adam").
_TABLE_6_2_ROWS = {
    'FedAvg': r'FedAvg [24] Averages models \mathbf{x} \mathbf{x}',
    'AdaptiveFedOpt': r'AdaptiveFedOpt [25] Server-only optimiser \mathbf{x} \mathbf{x}',
    'FedProx': r'FedProx [36] Proximal term \mathbf{x} \mathbf{x}',
    'FedMAX': r'FedMAX [102] Max-entropy term \mathbf{x} \mathbf{x}',
    'MFL': r'MFL [39] Averages models and optimisers \mathbf{x}, \mathbf{s} \mathbf{x}, \mathbf{s}',
    'Mimelite': r'Mimelite [27] Unbiased global optimiser \mathbf{x}, \mathbf{s} $\mathbf{x}, '
                r'\nabla f$',
    'FedGBO': r'FedGBO Biased global optimiser \mathbf{x}, \mathbf{s} \mathbf{x}',
}
_S_SIZE = ('|s| = |x| (SGDm), 2|x| (Adam): seed 000 §4 "the total download cost is doubled, '
           'and tripled for Adam"')
SEED000_TABLE2 = {
    'FedAvg': ('x', 'x', 1, 1), 'FedAdam (FedOpt / AdaptiveFedOpt)': ('x', 'x', 1, 1),
    'FedProx': ('x', 'x', 1, 1), 'FedMAX': ('x', 'x', 1, 1),
    'MFL-SGDm': ('x, s', 'x, s', 2, 2), 'MFL-Adam': ('x, s', 'x, s', 3, 3),
    'Mimelite-SGDm': ('x, s', 'x, ∇f', 2, 2), 'Mimelite-Adam': ('x, s', 'x, ∇f', 3, 2),
    'FedGBO-SGDm': ('x, s', 'x', 2, 1), 'FedGBO-Adam': ('x, s', 'x', 3, 1),
}
# Seed 002 App. G.4's table: communication (down + up) and client memory, in d = |x|.
SEED002_TABLE_G4 = {'FedAvg': (2, 1), 'FedAdaGrad': (2, 1), 'DJA (AdaGrad-AdaGrad)': (3, 2),
                    'FedAda2 (SM3-AdaGrad)': (2, 2), 'Mimelite-SGDm': (4, 3)}
_G4_ROWS = {'FedAvg': '| FedAvg | N | 2d | 1 | d |', 'FedAdaGrad': '| FedAdaGrad | N | 2d | 1 | d |',
            'DJA (AdaGrad-AdaGrad)': '| DJA | Y | 3d | 1 | 2d |',
            'FedAda2 (SM3-AdaGrad)': '| FedAda2 | Y | 2d | 1 | 2d |',
            'Mimelite-SGDm': '| MIME/MIMELite | N | 5d / 4d | 3/2 | 4d / 3d |'}
# reports/fedada2.md: SM3-Adam's client state on the digits MLP (|x| = 4,810).
FEDADA2_MD_SM3_ADAM_FLOATS = 5086


def _d(k) -> str:
  """k·d as seed 002's table prints it ('d', '2d')."""
  return 'd' if k == 1 else f'{k:g}d'


def _table_6_2_source(label: str, down_sym: str, up_sym: str) -> Source:
  key = 'AdaptiveFedOpt' if label.startswith('FedAdam') else label.split('-')[0]
  latex = {'x': r'\mathbf{x}', 'x, s': r'\mathbf{x}, \mathbf{s}', 'x, ∇f': r'\mathbf{x}, \nabla f'}
  derived = 'the table prints symbols, read as multiples of |x|' + (
      f' with {_S_SIZE}' if 's' in down_sym + up_sym else '')
  return Source(SEED, '004', _TABLE_6_2_ROWS[key], (latex[down_sym], latex[up_sym]), derived)


def communication_checks(costs: dict[str, ProcessCost]) -> list[Check]:
  rows = []
  for label, (down_sym, up_sym, down_k, up_k) in SEED000_TABLE2.items():
    c = costs[label]
    (kd, rd), (ku, ru) = c.floats(c.down_bits), c.floats(c.up_bits)
    # Scalars (the round's η and K, Adam's step counter, TFF's hyperparameters)
    # are below one float per parameter: they are not part of the table.
    ok = kd == down_k and ku == up_k and rd < 32 * 64 and ru < 32 * 64
    rows.append(Check('thesis Table 6.2 (= seed 000 Table 2)', f'{label}: download; upload',
                      f'{down_sym} = {down_k}|x|; {up_sym} = {up_k}|x|',
                      f'{c.describe(c.down_bits)}; {c.describe(c.up_bits)}',
                      MATCH if ok else MISMATCH,
                      'the extra bits are scalars: the round\'s η and K (64 b) and optimiser '
                      'counters / hyperparameters' if (rd or ru) else '',
                      _table_6_2_source(label, down_sym, up_sym)))
  for label, (comm_k, mem_k) in SEED002_TABLE_G4.items():
    c = costs[label]
    (kd, _), (ku, _) = c.floats(c.down_bits), c.floats(c.up_bits)
    memory = 1 + c.state_floats / c.num_params
    comm_ok = kd + ku == comm_k
    mem_ok = math.isclose(memory, mem_k)
    note, construction = '', ''
    if label.startswith('FedAda2'):
      sm3_adam = 1 + FEDADA2_MD_SM3_ADAM_FLOATS / 4810
      note = (f'memory: SM3-AdaGrad keeps {c.state_floats:.0f} floats (row and column covers) '
              f'for |x| = {c.num_params}, i.e. d + o(d). The table\'s 2d is what a client with a '
              'dense first moment holds: dense AdaGrad (2d), or SM3-Adam, whose first moment '
              f'stays dense ({sm3_adam:.2f}d: reports/fedada2.md measures '
              f'{FEDADA2_MD_SM3_ADAM_FLOATS:,} floats for |x| = 4,810); seed 002 runs SM3 '
              '"adaptations of Adam and Adagrad"')
    ours_memory = _d(float(f'{memory:.3g}'))
    if label.startswith('Mimelite'):
      construction = ('+ d for ∇f: TFF\'s Mimelite computes the full-batch gradient before the '
                      'local steps and uploads it after them (the second model-sized value it '
                      'aggregates, measured), so the client holds it during training; that it '
                      'is held is by construction, not measured')
      note = 'memory: model d + optimiser state (momentum) d, measured from the cost metrics'
      ours_memory = f'{_d(float(f"{memory:.3g}"))} + d (∇f, by construction)'
      mem_ok = math.isclose(memory + 1, mem_k)
    rows.append(Check('seed 002 App. G.4 table', f'{label}: communication; client memory',
                      f'{_d(comm_k)}; {_d(mem_k)}', f'{_d(kd + ku)}; {ours_memory}',
                      MATCH if comm_ok and mem_ok else MISMATCH, note,
                      Source(SEED, '002', _G4_ROWS[label],
                             tuple(_G4_ROWS[label].split('|')[i].strip() for i in (3, 5))),
                      construction))
  return rows


# ---------------------------------------------------------------------------

FLOPS_SECTION = 'FLOPs per client per round (thesis Tables B.2 and B.3 = seed 000 Tables 4 and 10)'
COMMUNICATION_SECTION = ('Communication and memory (thesis Table 6.2 = seed 000 Table 2, seed 002 '
                         'App. G.4)')


def exact_checks(with_processes: bool = True,
                 progress: Callable[[str], None] = lambda m: None,
                 models: Optional[dict] = None) -> dict[str, list[Check]]:
  """Every check by section name; `with_processes=False` skips the TFF processes."""
  models = models or flops_models()
  sections = {
      'Decaying local steps (seed 001, thesis ch. 5)': seed001_step_fractions() +
                                                       thesis_table_5_4(),
      'Model size (SPEC §8: no seed prints these numbers)': model_size_checks(models),
      'Compression (thesis ch. 3)': compression_checks(),
      'Quadratic toy (seed 001 §3)': quadratic_checks(),
  }
  if with_processes:
    sections[COMMUNICATION_SECTION] = communication_checks(
        measure_process_costs(progress=progress))
  sections[FLOPS_SECTION] = flops_checks(flops_cells(models))
  return sections


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


def headline_markdown(sections: dict[str, list[Check]]) -> str:
  """The headline of section 1, every count from `summary(sections)`."""
  t = summary(sections)
  flops_quantities = len(FLOPS_QUANTITIES) * len(FLOPS_TASKS)

  def ok(x: Tally, word: str = 'match') -> str:
    return f'{x.matched} {word}' + (
        f', {x.mismatched} {"does" if x.mismatched == 1 else "do"} not' if x.mismatched else '')

  lines = [
      f'**{t[INDEPENDENT].rows} rows recompute independent numbers printed in the seeds: '
      f'{ok(t[INDEPENDENT])}** (each ✗ explained in its row). {ROUNDING_RULE}; the column '
      '"source" names where the expected value is printed, and the tests find each quoted '
      'print in the seed texts.', '',
      'Besides these, and not counted with them:', '',
      f'- {t[FLOPS].rows} FLOPs cells (thesis Tables B.2/B.3 = seed 000 Tables 4/10): '
      f'{ok(t[FLOPS])}. They are not {t[FLOPS].rows} independent numbers: the papers compute '
      f'them with one formula (eq. B.16) from {flops_quantities} model quantities '
      f'({", ".join(FLOPS_QUANTITIES)} of {len(FLOPS_TASKS)} tasks), and every K = 50 cell but '
      'Mimelite\'s is 5× its K = 10 cell before rounding.',
      f'- {t[DERIVED].rows} printed values that the papers derive from other printed values '
      f'("3.8x" = 1/0.26, the "≈ 1 : 2.3" upload ratio, Table 6.2\'s symbols read as multiples '
      f'of |x|): {ok(t[DERIVED])}.',
      f'- {t[STATEMENT].rows} printed statements without a number (x̃* = x* at K = 1 and grows '
      f'with K; decaying K reaches x*): {ok(t[STATEMENT], "hold")}.',
      f'- {t[SPEC_NUMBER].rows} numbers from SPEC that no seed prints (the CIFAR100 CNN\'s |x| '
      f'and forward FLOPs; seed 000 gives only its layers): {ok(t[SPEC_NUMBER])}.',
      f'- {t[CONSTRUCTION].rows} row{"" if t[CONSTRUCTION].rows == 1 else "s"} that '
      f'hold{"s" if t[CONSTRUCTION].rows == 1 else ""} partly by construction (Mimelite\'s ∇f '
      f'in client memory, labelled in the row): {ok(t[CONSTRUCTION])}.',
      f'- {t[PACKAGE_VS_PACKAGE].rows} package-vs-package rows (our Golomb encoder against our '
      f'eqs. 3.1-3.2; no published number): {ok(t[PACKAGE_VS_PACKAGE], "agree within 3%")}.',
      f'- {t[FIGURE_ONLY].rows} values the seeds show only in a figure (ours for reference).',
  ]
  return '\n'.join(lines)


def _source_cell(check: Check) -> str:
  kind = kind_of(check)
  label = {FLOPS: ' (derived: eq. B.16)', DERIVED: ' (derived)', STATEMENT: ' (statement)',
           SPEC_NUMBER: ' (SPEC, not a seed)', CONSTRUCTION: ' (partly by construction)',
           PACKAGE_VS_PACKAGE: ' (package vs package)', FIGURE_ONLY: ' (figure only)'}
  return check.section + label.get(kind, '')


def _cell(text: str) -> str:
  """Markdown table cell: a literal | (as in |x|) would end the cell."""
  return str(text).replace('|', '\\|')


def checks_markdown(checks: Sequence[Check]) -> str:
  lines = ['| source | item | paper | ours | | note |', '|---|---|---|---|---|---|']
  previous_note = None
  for c in checks:
    note = c.note
    if c.construction:
      note = (note + '; ' if note else '') + 'by construction: ' + c.construction
    if c.source.derived and kind_of(c) == DERIVED:
      note = (note + '; ' if note else '') + 'derived: ' + c.source.derived
    shown = '″' if note and note == previous_note else note  # ditto for repeats
    previous_note = note
    lines.append('| ' + ' | '.join(_cell(x) for x in (_source_cell(c), c.item, c.paper, c.ours,
                                                       c.status, shown)) + ' |')
  return '\n'.join(lines)


# ---------------------------------------------------------------------------
# Qualitative findings on the offline task (the sweep of reports/reproduction_grid.txt).

@dataclasses.dataclass(frozen=True)
class Claim:
  source: str
  claim: str
  better: str  # group expected to win
  worse: str
  quantity: str  # 'score' or a report.COST_AXES key (lower is better)
  # 'better': `better` must win; 'no_worse': the claim is parity ("as accurate
  # as"), which holds unless `better` is significantly worse.
  kind: str = 'better'


CLAIMS = (
    Claim('seed 003 (FedOpt)', 'an adaptive server optimiser (FedAdam) improves on FedAvg',
          'fedadam', 'fedavg', 'score'),
    Claim('seed 000 (FedGBO)', 'FedGBO (Adam) beats FedAvg, at the same upload per round',
          'fedgbo_adam', 'fedavg', 'score'),
    Claim('seed 000 (FedGBO)', 'FedGBO reaches the target in fewer rounds than FedAvg',
          'fedgbo_adam', 'fedavg', 'round'),
    Claim('seed 000 (FedGBO)', 'FedGBO beats AdaptiveFedOpt (FedAdam)', 'fedgbo_adam', 'fedadam',
          'score'),
    Claim('seed 000 (FedGBO)', 'FedGBO needs less upload than MFL to reach the target (MFL-Adam '
          'uploads 3|x| per round)', 'fedgbo_adam', 'mfl_adam', 'cost/cumulative_upload_bits'),
    Claim('seed 000 (FedGBO)', 'MFL has fast initial convergence (rounds to target vs FedAvg)',
          'mfl_adam', 'fedavg', 'round'),
    Claim('seed 002 (FedAda2)', 'joint adaptivity without preconditioner communication (FedAda2, '
          'SM3 clients) beats server-only FedAdam at the same communication', 'fedada2',
          'fedadam', 'score'),
    Claim('thesis ch. 3 (CE-FedAvg)', 'CE-FedAvg reaches the target in fewer rounds than FedAvg '
          'with the same compression (s = 0.9)', 'ce_fedavg', 'fedavg_topk', 'round'),
    Claim('thesis ch. 3 (CE-FedAvg)', 'CE-FedAvg uploads less in total than compressed FedAvg to '
          'reach the target', 'ce_fedavg', 'fedavg_topk', 'cost/cumulative_upload_bits'),
    Claim('thesis ch. 3 (CE-FedAvg)', 'CE-FedAvg beats compressed FedAvg in accuracy',
          'ce_fedavg', 'fedavg_topk', 'score'),
    Claim('seed 000 (FedGBO)', 'FedGBO (SGDm) beats FedAvg', 'fedgbo_sgdm', 'fedavg', 'score'),
    Claim('seed 000 (FedGBO)', 'FedGBO (RMSProp) beats FedAvg', 'fedgbo_rmsprop', 'fedavg',
          'score'),
    Claim('seed 000 (FedGBO)', 'FedGBO (SGDm) needs less upload than Mimelite (SGDm, uploads '
          '2|x|) to reach the target', 'fedgbo_sgdm', 'mimelite_sgdm',
          'cost/cumulative_upload_bits'),
    Claim('seed 000 (FedGBO)', 'FedGBO (SGDm) is at least as accurate as Mimelite (SGDm)',
          'fedgbo_sgdm', 'mimelite_sgdm', 'score', 'no_worse'),
    Claim('seed 002 (FedAda2)', 'FedAda2 (no preconditioner sent, SM3 clients) is as accurate as '
          'DJA (which sends the server v, 2|x| down)', 'fedada2', 'dja', 'score', 'no_worse'),
    Claim('seed 001 (decaying K)', 'decaying K reaches at least the accuracy of decaying γ',
          'k_decay', 'lr_decay', 'score', 'no_worse'),
    Claim('seed 001 (decaying K)', 'decaying K reaches the target with fewer client FLOPs (steps) '
          'than constant K', 'k_decay', 'fedavg', 'cost/cumulative_client_flops'),
)


def _disjoint(a, b) -> bool:
  return (math.isfinite(a.half_width) and math.isfinite(b.half_width) and
          (a.low > b.high or b.low > a.high))


def _verdict(a, b, higher_is_better: bool, kind: str = 'better') -> str:
  """Compares two stats.MeanCI by the means, then says whether the CIs are disjoint.

  'better' claims need `a` to win; parity claims ('no_worse', "as accurate
  as") hold by the means when `a` is at least as good. Either way only
  disjoint intervals are evidence.
  """
  if a.n == 0 or b.n == 0:
    return 'cannot tell (missing results)'
  if a.mean == b.mean:
    return 'tie'
  disjoint = _disjoint(a, b)
  a_better = a.mean > b.mean if higher_is_better else a.mean < b.mean
  if kind == 'no_worse':
    if a_better:
      return 'holds (not worse: ' + ('better, CIs disjoint)' if disjoint else 'CIs overlap)')
    return ('does not hold (significantly worse: CIs disjoint)' if disjoint else
            'does not hold by the means (worse; CIs overlap: parity not rejected)')
  strength = 'CIs disjoint' if disjoint else 'CIs overlap: not significant'
  return f'{"holds" if a_better else "does not hold"} ({strength})'


# How a verdict counts: by the means (holds / fails / tie) and whether the data
# support it beyond the noise.
HOLDS_SUPPORTED = 'holds, supported'  # disjoint CIs, or only the baseline misses the target
HOLDS_NS = 'holds by the means, not significant'
TIE = 'tie'
FAILS_NS = 'fails by the means, not significant'
FAILS_SIGNIFICANT = 'fails, CIs disjoint'
CANNOT_TELL = 'cannot tell'


def verdict_class(verdict: str) -> str:
  if verdict.startswith('cannot tell'):
    return CANNOT_TELL
  if verdict == 'tie':
    return TIE
  if verdict.startswith('holds'):
    supported = 'CIs disjoint' in verdict or 'baseline misses' in verdict
    return HOLDS_SUPPORTED if supported else HOLDS_NS
  if 'CIs disjoint' in verdict or 'only the baseline reaches' in verdict:
    return FAILS_SIGNIFICANT
  return FAILS_NS


def claims_tally_markdown(verdicts: Sequence[str], num_seeds: int) -> str:
  """The tally the claims table supports, every count from `verdicts`."""
  classes = [verdict_class(v) for v in verdicts]
  n = {k: classes.count(k) for k in (HOLDS_SUPPORTED, HOLDS_NS, TIE, FAILS_NS, FAILS_SIGNIFICANT,
                                     CANNOT_TELL)}
  held, failed = n[HOLDS_SUPPORTED] + n[HOLDS_NS], n[FAILS_NS] + n[FAILS_SIGNIFICANT]
  disjoint_for = sum(verdict_class(v) == HOLDS_SUPPORTED and 'CIs disjoint' in v for v in verdicts)
  missed = n[HOLDS_SUPPORTED] - disjoint_for
  text = (f'By the means, {held} of {len(verdicts)} claims hold on this task, {failed} do not'
          f'{f" and {n[TIE]} is a tie" if n[TIE] == 1 else f" and {n[TIE]} are ties" if n[TIE] else ""}'
          f'{f" ({n[CANNOT_TELL]} cannot be told)" if n[CANNOT_TELL] else ""}. Supported beyond '
          f'the noise: {n[HOLDS_SUPPORTED]} ({disjoint_for} by disjoint intervals'
          f'{f", {missed} because the baseline misses the target on some seeds" if missed else ""}'
          f'); contradicted by disjoint intervals: {n[FAILS_SIGNIFICANT]}; the other '
          f'{n[HOLDS_NS] + n[FAILS_NS]} differences ({n[HOLDS_NS]} for a claim, {n[FAILS_NS]} '
          'against, parity claims included by their means) are not significant: with '
          f'{num_seeds} seeds the 95% t-interval has a half-width of {stats_t(num_seeds):.1f} '
          'standard errors.')
  return text


def evaluate_claims(groups, target: float, claims: Sequence[Claim] = CLAIMS) -> list[dict]:
  """groups: report.group_results(...). One dict per claim with the numbers and a verdict."""
  rows = []
  for c in claims:
    a, b = groups.get(c.better), groups.get(c.worse)
    if a is None or b is None:
      rows.append(dict(claim=c, a='—', b='—', verdict='cannot tell (group missing)'))
      continue
    if c.quantity == 'score':
      va, vb = a.best.score, b.best.score
      rows.append(dict(claim=c, a=va.format(4), b=vb.format(4),
                       verdict=_verdict(va, vb, True, c.kind)))
      continue
    ra, rb = a.reaches[c.quantity], b.reaches[c.quantity]
    sci = c.quantity.startswith('cost/')
    rows.append(dict(claim=c, a=ra.format(3, sci), b=rb.format(3, sci),
                     verdict=_reach_verdict(ra, rb)))
  return rows


def _reach_verdict(ra, rb) -> str:
  """Verdict on a cost to reach the target (lower is better): report.Reach a vs b."""
  if ra.reached < ra.seeds and rb.reached == rb.seeds:
    return 'does not hold (only the baseline reaches the target on every seed)'
  if rb.reached < rb.seeds and ra.reached == ra.seeds:
    return 'holds (the baseline misses the target on some seed)'
  if ra.reached == 0 and rb.reached == 0:
    return 'cannot tell (neither reaches the target)'
  return _verdict(ra.cost, rb.cost, False)


_CELL = re.compile(r'^(?P<group>[\w]+): (?:not reached \(0/(?P<none>\d+)\)|(?P<mean>[-+.\de]+)'
                   r'(?: ± (?P<hw>[-+.\de]+))?(?: \((?P<reached>\d+)/(?P<seeds>\d+)\))?)$')


def _parse_claim_cell(cell: str, quantity: str, num_seeds: int):
  """'fedadam: 0.9465 ± 0.0182' → stats.MeanCI, or report.Reach for costs to a target."""
  from workflow import report  # pylint: disable=g-import-not-at-top
  from workflow import stats  # pylint: disable=g-import-not-at-top
  m = _CELL.match(cell.strip())
  if m is None:
    raise ValueError(f'cannot read the claims cell {cell!r}')
  if m['none']:
    return report.Reach(stats.MeanCI(math.nan, math.nan, 0), 0, int(m['none']))
  reached = int(m['reached']) if m['reached'] else num_seeds
  ci = stats.MeanCI(float(m['mean']), float(m['hw']) if m['hw'] else math.nan, reached)
  if quantity == 'score':
    return ci
  return report.Reach(ci, reached, int(m['seeds']) if m['seeds'] else num_seeds)


def reevaluate_claims_table(section: str, num_seeds: int) -> tuple[str, list[str]]:
  """Recomputes the verdicts of a claims table already in a report from its printed numbers.

  For regenerating the report without the sweep's runs: the table's means and
  95% half-widths are what the verdicts use (printed to 3-4 digits). Returns
  the section with the table's verdicts and the tally after it rewritten, and
  the verdicts.
  """
  lines = section.split('\n')
  head = lines.index('| source | claim | measured | claimed better | baseline | verdict |')
  verdicts = []
  for i, claim in enumerate(CLAIMS):
    line = lines[head + 2 + i]
    cells = [c.strip() for c in re.split(r'(?<!\\)\|', line)[1:-1]]
    if cells[1] != _cell(claim.claim):
      raise ValueError(f'claims table row {i} is not {claim.claim!r}: {cells[1]!r}')
    a = _parse_claim_cell(cells[3], claim.quantity, num_seeds)
    b = _parse_claim_cell(cells[4], claim.quantity, num_seeds)
    verdict = (_verdict(a, b, True, claim.kind) if claim.quantity == 'score'
               else _reach_verdict(a, b))
    verdicts.append(verdict)
    lines[head + 2 + i] = '| ' + ' | '.join(cells[:5] + [verdict]) + ' |'
  end = head + 2 + len(CLAIMS)
  if lines[end]:
    raise ValueError('the claims table has more rows than CLAIMS')
  lines[end + 1] = claims_tally_markdown(verdicts, num_seeds)  # the paragraph after the table
  return '\n'.join(lines), verdicts


def claims_markdown(rows: Sequence[dict], target: float, metric: str) -> str:
  from workflow import report  # pylint: disable=g-import-not-at-top
  lines = ['| source | claim | measured | claimed better | baseline | verdict |',
           '|---|---|---|---|---|---|']
  for r in rows:
    c = r['claim']
    what = ('score' if c.quantity == 'score' else
            f'{report.COST_AXES[c.quantity]} to {metric} ≥ {target:g}')
    lines.append('| ' + ' | '.join(_cell(x) for x in (
        c.source, c.claim, what, f'{c.better}: {r["a"]}', f'{c.worse}: {r["b"]}',
        r['verdict'])) + ' |')
  return '\n'.join(lines)


# ---------------------------------------------------------------------------
# reports/reproduction.md

NOT_CHECKABLE = (
    'seed 000 Tables 3-8 / thesis Tables 6.3-6.5 (accuracies, rounds, uploads and FLOPs to '
    'accuracy on CIFAR100, Sent140, FEMNIST, Shakespeare): need the datasets and 1000s of rounds.',
    'seed 001 Table 1 error/accuracy rows and seed 001 Figure 1 curves beyond the fixed points: '
    'need StackOverflow / FEMNIST / Shakespeare (the quadratic curves are simulated above).',
    'seed 002 DP StackOverflow ε: the noise multiplier, sampling rate, rounds and ε are missing '
    'from the extracted text, so there is no printed number to check `accounting.privacy` '
    'against; seed 002 Tables 3-5 (tuned hyperparameters) are settings, not results.',
    'seed 003 (FedOpt): every table is an accuracy on a TFF dataset.',
    'thesis Table 5.4 K_r-error and K_r-step rows: depend on the training losses and plateau '
    'times of the real runs.',
    'thesis Tables 3.1-3.3 (rounds to target for CE-FedAvg vs FedAvg), 4.x (MTFL user '
    'accuracy): need MNIST / CIFAR10 runs.',
)


def write_reproduction_report(out_md: str, sweep_dir: str, *, target: float = 0.85,
                              select_rule: str = 'last_mean:3', metric: str = 'eval/accuracy',
                              with_processes: bool = True, sweep_minutes: Optional[float] = None,
                              grid_file: str = 'reports/reproduction_grid.txt',
                              progress: Callable[[str], None] = lambda m: None) -> str:
  """Writes reports/reproduction.md (+ its figure); returns the markdown."""
  import os  # pylint: disable=g-import-not-at-top
  from workflow import report  # pylint: disable=g-import-not-at-top
  from workflow import sweep  # pylint: disable=g-import-not-at-top
  from workflow import selection  # pylint: disable=g-import-not-at-top

  progress('exact figures')
  models = flops_models()
  cells = flops_cells(models)
  sections = exact_checks(with_processes, progress=progress, models=models)
  flops_bad = [c for c in cells if not c.matches]

  out = ['# Reproduction report', '',
         'Regenerate everything (the sweep resumes; finished trials are skipped):', '',
         '    bin/reproduce_report.sh', '',
         'which runs `bin/sweep.py --spec=reports/reproduction_grid.txt --num_seeds=5 '
         '--max_parallel=2 --sweep_dir=runs/reproduction` and then `.venv/bin/python '
         'bin/report.py --reproduction --sweep_dir=runs/reproduction '
         '--out=reports/reproduction.md`.', '']
  out += ['## 1. Exact figures recomputed by the package', '', headline_markdown(sections), '',
          'SPEC §10 settles the papers\' errata.', '']
  for title, rows in sections.items():
    if title == FLOPS_SECTION:
      continue
    out += [f'### {title}', '', checks_markdown(rows), '']
  flops_tally = summary({FLOPS_SECTION: sections[FLOPS_SECTION]})[FLOPS]
  out += [f'### {FLOPS_SECTION}',
          '', 'Cells are `paper / ours` in 10⁸ FLOPs, ours rounded half away from zero to 3 '
          'significant figures (the tables\' stated precision), from '
          '`accounting.flops.client_flops` (eq. B.16) on the Keras models: the CIFAR100 and '
          'FEMNIST CNNs of `tasks/models/paper_cnns.py`, Sent140\'s linear model and '
          'Shakespeare\'s GRU as seed 000 Appendix B defines them. B = 32 (8 for Sent140), '
          'n = 100 / 15 / 170 / 5573 samples per client (Mimelite\'s full-batch pass). The '
          'cells are derived numbers: the papers compute all of them with eq. B.16 from '
          f'{len(FLOPS_QUANTITIES) * len(FLOPS_TASKS)} model quantities, so {flops_tally.matched} '
          f'matching cells confirm those quantities and the formula, not {flops_tally.matched} '
          'independent results. The printed cells are quoted from thesis Tables B.2/B.3, and '
          'Shakespeare\'s K = 50 MFL row, which the thesis\' text lost, from seed 000 Table 10.',
          '', '**K = 10 (Table B.2)**', '', flops_table_markdown(cells, 10), '',
          '**K = 50 (Table B.3)**', '', flops_table_markdown(cells, 50), '',
          f'{flops_tally.matched} of {flops_tally.rows} cells match.']
  if flops_bad:
    out += ['', f'¹ {_SENT140_ERRATUM}.']
  out += ['', '### Not checkable without the datasets', '']
  out += [f'- {item}' for item in NOT_CHECKABLE]

  # ---- Qualitative part.
  out += ['', '## 2. Qualitative findings on the offline task', '']
  try:
    results, _ = selection.load_results(sweep_dir, sweep.parse_spec_file(grid_file))
    missing = 'no finished trials'
  except sweep.SpecError as e:
    results, missing = [], str(e)
  previous = _previous_sweep_section(out_md) if not results else None
  if not results and previous is None:
    out += [f'No sweep results: {missing}.']
  elif not results:
    progress('claims re-evaluated from the previous report')
    seeds_text = re.search(r'seeds ((?:\d+, )*\d+)\.', previous)
    num_seeds = len(seeds_text.group(1).split(', ')) if seeds_text else 0
    section, _ = reevaluate_claims_table(previous, num_seeds)
    out += [REUSED_SWEEP_NOTE, '', section.rstrip('\n')]
  if results:
    rule = selection.parse_rule(select_rule, metric, 'max')
    summaries = selection.summarize(results, rule)
    groups = report.group_results(summaries, rule, target)
    trials = len(results)
    seeds = sorted({r.trial.seed for r in results})
    fig = os.path.splitext(out_md)[0] + '_curves.png'
    report.plot_mean_curves(report.best_curves(summaries, rule, tuple(report.COST_AXES)),
                            metric, fig, 'digits: selected configuration per algorithm, '
                            f'mean ± 95% CI over {len(seeds)} seeds')
    names = {r.trial.name for r in results}
    seconds = {k: v for k, v in sweep.trial_seconds(sweep_dir).items() if k in names}
    cpu = {k: v for k, v in sweep.trial_seconds(sweep_dir, 'cpu_seconds', True).items()
           if k in names}
    timing = ''
    if cpu:
      per_trial = sum(cpu.values()) / len(cpu)
      timing = (f' A trial takes {per_trial:.0f} s of CPU time (mean of the {len(cpu)} trials '
                f'whose last run went from round 0), so the {trials} trials need about '
                f'{per_trial * trials / 60 / 2:.0f} minutes on 2 idle cores with '
                '`--max_parallel=2`.')
    if seconds:
      timing += (f' Here they took {sum(seconds.values()) / 60 / 2:.0f} minutes of wall time '
                 '(sum of trial times / 2) on a machine shared with other jobs.')
    if sweep_minutes is not None:
      timing += (f' The last `bin/reproduce_report.sh` spent {sweep_minutes:.0f} minutes in '
                 'the sweep.')
    out += [f'Setup (`{grid_file}`): the `digits` task (scikit-learn\'s 1,797 8×8 digits, '
            'Dirichlet(0.5) label split over the task\'s clients, MLP with '
            '|x| = 4,810), 10 clients per round, exactly K = 10 local steps of batch 10, '
            '20 rounds, evaluation every 2 rounds. Each algorithm gets a two- or three-point '
            f'grid on its key learning rate (see the grid file for why); {trials} trials, '
            f'seeds {", ".join(map(str, seeds))}.'
            f'{timing}', '',
            report.markdown_tables(summaries, rule, target), '',
            f'![curves]({os.path.basename(fig)})', '',
            'Curves: mean over seeds (band: 95% CI) of the selected configuration, against '
            'rounds, total uploaded bits, total client FLOPs, and the thesis\' runtime model '
            '(β = 5 ms per step, D = 20 and U = 5 Mbit/s).', '',
            '### The papers\' claims on this task', '']
    rows = evaluate_claims(groups, target)
    out += [claims_markdown(rows, target, metric), '']
    out += [claims_tally_markdown([r['verdict'] for r in rows], len(seeds)),
            '', '**How far this goes.** The papers\' claims are about models of 10k to 22M '
            'parameters (seed 000\'s Sent140 linear model to seed 002\'s ViT-S) trained for '
            'thousands of rounds on real federated data. Here a 4,810-parameter MLP on 8×8 '
            f'digits gets to {_score_text(groups.get("fedavg"))} with plain FedAvg in 20 '
            'rounds, so the algorithms have little room to differ: a claim that does not hold '
            'here is not refuted for the papers\' tasks, and one that holds is only consistent '
            'with them. Short runs favour methods that move fast early and hide late-training '
            'effects; for instance FedGBO\'s server-tracked second moment v starts at 1 and is '
            'updated once per round with β2 = 0.99, so after 20 rounds v ≥ 0.99²⁰ = 0.82 and '
            'FedGBO-Adam\'s client steps are within 1/√0.82 ≈ 1.1× of FedGBO-SGDm\'s: its '
            'adaptivity has not started. The two-point grids are far smaller than the '
            'papers\', so a ranking is partly a ranking of how well each grid fits.']
  out += ['', '## 3. Elsewhere, and not done here', '',
          '- MTFL\'s private choices (thesis ch. 4): `reports/mtfl.md` (one seed, Table 4.2 '
          'style); decaying K in depth (all K schedules, the quadratic toy, simulated time): '
          '`reports/schedules.md`; FedAda2 vs DJA with memory and DP: `reports/fedada2.md`; '
          'CE-FedAvg Tables 3.1-3.3: `reports/ce_fedavg.md`.',
          '- The qualitative sweep covers `digits` only, not `synthetic` (`reports/'
          'algorithms.md` and `reports/fedada2.md` have single-seed `synthetic` runs).',
          '- The papers\' own runs need their datasets: `bin/train.py --preset=<paper>:<task>` '
          '(`workflow/presets.py`, the rows of `docs/tasks.md`) sets each published '
          'setting, e.g. `--preset=fedgbo:femnist --data_dir=...`.', '']
  text = '\n'.join(out)
  os.makedirs(os.path.dirname(os.path.abspath(out_md)), exist_ok=True)
  with open(out_md, 'w') as f:
    f.write(text)
  return text


REUSED_SWEEP_NOTE = (
    '*This section comes from the last run of the sweep: its runs were not available when the '
    'report was regenerated, so the tables are the earlier report\'s, and the verdicts and the '
    'tally under the claims table were recomputed from that table\'s printed means and '
    'intervals (`reproduction.reevaluate_claims_table`).*')


def _previous_sweep_section(path: str) -> Optional[str]:
  """Section 2 of an existing report (without its heading and any reuse note), or None."""
  import os  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    return None
  with open(path) as f:
    text = f.read()
  start = text.find('## 2. Qualitative findings on the offline task\n')
  end = text.find('\n## 3. ')
  if start < 0 or end < 0 or 'No sweep results' in text[start:end]:
    return None
  section = text[start:end].split('\n', 1)[1].strip('\n')
  if section.startswith(REUSED_SWEEP_NOTE):
    section = section[len(REUSED_SWEEP_NOTE):].strip('\n')
  return section


def _score_text(group) -> str:
  if group is None or group.best.score.n == 0:
    return 'high accuracy'
  return f'{group.best.score.mean:.1%} test accuracy (mean of its last 3 evaluations)'


def stats_t(num_seeds: int) -> float:
  from workflow import stats  # pylint: disable=g-import-not-at-top
  return stats.t_quantile(0.95, num_seeds - 1) if num_seeds > 1 else math.inf
