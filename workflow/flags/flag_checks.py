"""The checks a flag's table entry holds (`train_flags.Flag.checks`): one value's bounds.

A `Check` says what a value must be and, when it is not, the one line
bin/train prints: `--<flag> must be <wording>; got <value>`.
`workflow.flags.validation` runs every entry's checks, in the table's order; the
rules that relate several flags are its own. Plain Python: bin/train refuses
a bad value before it imports TensorFlow.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class Check:
  """`holds(value)` for every value but None (a flag left unset); `wording` completes
  `--<flag> must be ...` when it does not."""
  holds: Callable[[Any], bool]
  wording: str

  def problem(self, flag: str, value: Any) -> Optional[str]:
    """The line that refuses `--flag=value`, or None when the value is allowed."""
    if value is None or self.holds(value):
      return None
    return f'--{flag} must be {self.wording}; got {value}'


POSITIVE_INT = Check(lambda v: v >= 1, 'a positive integer (>= 1)')
NON_NEGATIVE_INT = Check(lambda v: v >= 0, 'a non-negative integer (>= 0)')
POSITIVE = Check(lambda v: v > 0, 'a positive number (> 0)')
NON_NEGATIVE = Check(lambda v: v >= 0, 'a non-negative number (>= 0)')
UNIT_INTERVAL = Check(lambda v: 0 <= v < 1, 'in [0, 1)')

# Bounds beyond which a flag only hangs or overflows.
# Dirichlet(α) sampling (NumPy's) takes time ~1/α: 0.1 ms per draw of 50 shares at
# α = 1e-4, 0.5 s at 1e-9, no end at 1e-30; below ~1e-3 every client holds one label anyway.
MIN_DIRICHLET_ALPHA = 1e-4
# The RDP accountant fails numerically above σ ≈ 1e4 (and overflows at 1e154);
# ε is already ≈ 0 at σ = 1000.
MAX_DP_NOISE_MULTIPLIER = 1e3
# The papers use K of tens to hundreds; 2·10⁹ steps is a round that never ends.
MAX_LOCAL_STEPS = 100_000
MAX_SEED = 2**32 - 1  # NumPy's and TF's seeds

DIRICHLET_ALPHA = Check(lambda v: not 0 < v < MIN_DIRICHLET_ALPHA,
                        f'at least {MIN_DIRICHLET_ALPHA:g} (smaller values give every client '
                        'one label, and sampling them takes ~1/α time)')
DP_NOISE_MULTIPLIER = Check(lambda v: v <= MAX_DP_NOISE_MULTIPLIER,
                            f'at most {MAX_DP_NOISE_MULTIPLIER:g} (ε is already ≈ 0 there, and '
                            'the privacy accountant fails beyond)')
LOCAL_STEPS = Check(lambda v: v <= MAX_LOCAL_STEPS, f'at most {MAX_LOCAL_STEPS} per round')
SEED = Check(lambda v: v <= MAX_SEED, f'in [0, {MAX_SEED}]')
DP_DELTA = Check(lambda v: 0 <= v < 1, 'in [0, 1) (0: 1 / number of clients)')
DIVERGENCE_FACTOR = Check(lambda v: v == 0 or v > 1, '0 (off) or a number above 1')
EXECUTION_CONCURRENCY = Check(lambda v: v >= -1,
                              '-1 (unlimited), 0 (default) or a positive integer')
DECAY_FACTOR = Check(lambda v: 0 < v <= 1, 'in (0, 1]')
