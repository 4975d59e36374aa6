"""Confidence intervals over seeds, the way the papers report them.

The FedGBO paper (Table 6.4, "95% confidence intervals in brackets") and the thesis'
Figure 5.2 ("shaded regions show 95% confidence intervals of the mean over 5
random trials") give mean ± half-width of a Student-t interval over seeds:
    mean ± t_{(1+c)/2, n-1} · s / √n,
with s the sample standard deviation (ddof = 1). With n seeds this small the
t quantile matters: t_{0.975, 1} = 12.71, t_{0.975, 4} = 2.78, not 1.96.
"""

import dataclasses
import math
from collections.abc import Iterable

import numpy as np
from scipy import stats as scipy_stats


@dataclasses.dataclass(frozen=True)
class MeanCI:
  """Mean of `n` finite values and the half-width of its confidence interval."""
  mean: float
  half_width: float  # NaN when n < 2: one seed gives no interval.
  n: int

  @property
  def low(self) -> float:
    return self.mean - self.half_width

  @property
  def high(self) -> float:
    return self.mean + self.half_width

  def format(self, digits: int = 3, scale: float = 1.0) -> str:
    """'0.912 ± 0.004' ('0.912' for one seed, '—' for none)."""
    if self.n == 0:
      return '—'
    mean = f'{self.mean * scale:.{digits}f}'
    if not math.isfinite(self.half_width):
      return mean
    return f'{mean} ± {self.half_width * scale:.{digits}f}'


def t_quantile(confidence: float, dof: int) -> float:
  """Two-sided Student-t critical value t_{(1+c)/2, dof}."""
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1); got {confidence}')
  return float(scipy_stats.t.ppf(0.5 + confidence / 2.0, dof))


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> MeanCI:
  """Student-t interval of the mean of the finite `values` (NaN/inf ignored)."""
  x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
  n = int(x.size)
  if n == 0:
    return MeanCI(math.nan, math.nan, 0)
  mean = float(np.mean(x))
  if n == 1:
    return MeanCI(mean, math.nan, 1)
  sem = float(np.std(x, ddof=1)) / math.sqrt(n)
  return MeanCI(mean, t_quantile(confidence, n - 1) * sem, n)
