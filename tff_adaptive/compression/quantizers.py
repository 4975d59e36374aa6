"""UniQ and ExpQ: the 8-bit quantisers of CE-FedAvg (NumPy reference).

Implements Algorithms 3 (Uniform Quantization) and 4 (Exponential
Quantization) of thesis chapter 3, section 3.2, as read in
docs/algorithms.md#ce-fedavg and #errata. Both map a float32 vector to uint8 codes plus a few float32
side values. `tf_ops` holds the TensorFlow twins, which are tested to produce
bit-identical codes, side information and decoded values.

UniQ (weight deltas). Negative values use codes 0..127, the others 128..255,
each side with its own range:

  lz_min = min(a[a < 0]),  lz_max = max(a[a < 0]),
  gz_min = min(a[a >= 0]), gz_max = max(a[a >= 0]),
  q = floor((a - lo) * (127 / (hi - lo)))   (+128 on the non-negative side),

decoded to the lower edge of the bin: d = k * step + lo, with the step
(hi - lo) / 127 evaluated as float32 (hi - lo) * float32(1/127). Choices
made where the thesis is silent or ambiguous:
  * Exact zeros go to the non-negative side (the thesis leaves them at code 0,
    which would decode to lz_min, the most negative value). Then gz_min = 0
    whenever a zero is present, so zeros decode to exactly 0.
  * The side values and the step (hi - lo) / 127 are float32; the bin index
    is computed in float64 from them, and so is k * step + lo (exact product,
    one rounding, then cast to float32), which keeps the TF twin bit-identical
    even where TF's graph optimiser fuses multiply-add. A value equal to `hi`
    always gets code 127 (rounding cannot push the maximum into bin 126), and
    code 127 decodes to exactly `hi`: both endpoints of each side are
    reproduced exactly.
  * A side with no values sends lo = hi = 0; a side whose values are all equal
    (hi == lo) codes them all 127 and decodes them exactly.
  * The per-value error is below (hi - lo) / 127 on each side, up to float32
    rounding of the bin boundaries (a few ulp).
Side information: the 4 float32 values (lz_min, lz_max, gz_min, gz_max).

ExpQ (Adam moment deltas m, v). With delta = min nonzero |a| and base
b = delta^(-1/127) (docs/algorithms.md#errata; the thesis
 prints delta^(1/127)):

  p = clip(round(ln|a| / ln b), -127, -1),
  q = |p| for a < 0, 128 + |p| for a > 0, q = 0 for a == 0,
  decode: 0 -> 0, 1..127 -> -b^-q, 129..255 -> b^(128-q).

Choices:
  * Rounding is to the nearest integer (half to even), as the prose of the
    thesis says ("rounded to the nearest integer"); Algorithm 4's bracket
    looks like a floor, but rounding halves the worst-case error. For
    magnitudes in [delta, 1/b] the decoded value is within a factor b^(1/2)
    of the input (less than one base step).
  * Magnitudes above 1/b = delta^(1/127) saturate at 1/b (p clipped at -1,
    inherent in the scheme: code 128 would be b^0 and code 0 is reserved).
    Code 128 is never produced; `expq_decode` rejects it.
  * b is rounded to float32 (it is sent as one float) and the encoder uses
    that rounded b, so encoder and decoder agree on the grid. The logarithms
    and powers are evaluated in float64 and the result cast to float32.
  * delta is capped at 1/2 (`EXPQ_MAX_DELTA`). Without the cap a tensor whose
    nonzero magnitudes are all >= 1 gives b <= 1 (ln b = 0 at delta = 1); the
    cap changes nothing when delta < 1/2, and larger magnitudes saturate at
    1/b anyway. An all-zero tensor sends the base of delta = 1/2.
Side information: the base b (1 float32).

Non-finite inputs (NaN, +-Inf) are replaced by 0 before quantisation.
"""

import numpy as np

UNIQ_SIDE_FLOATS = 4
EXPQ_SIDE_FLOATS = 1
EXPQ_MAX_DELTA = 0.5
_LEVELS = 127
_INV_LEVELS = np.float32(1.0 / _LEVELS)


def sanitize(a: np.ndarray) -> np.ndarray:
  """Returns `a` as float32 with non-finite entries replaced by 0."""
  a = np.asarray(a, dtype=np.float32)
  return np.where(np.isfinite(a), a, np.float32(0.0)).astype(np.float32)


def _side_range(a: np.ndarray, mask: np.ndarray) -> tuple[np.float32,
                                                          np.float32]:
  if not np.any(mask):
    return np.float32(0.0), np.float32(0.0)
  selected = a[mask]
  return np.float32(selected.min()), np.float32(selected.max())


def _uniform_bins(a: np.ndarray, lo: np.float32, hi: np.float32) -> np.ndarray:
  """Bin index floor((a - lo) * (127 / (hi - lo))) in [0, 127] (float64)."""
  lo64, hi64 = np.float64(lo), np.float64(hi)
  span = hi64 - lo64
  scale = np.float64(_LEVELS) / span if span > 0 else np.float64(0.0)
  scaled = (a.astype(np.float64) - lo64) * scale
  bins = np.clip(np.floor(scaled), 0, _LEVELS)
  return np.where(a >= hi, _LEVELS, bins).astype(np.uint8)


def uniq_encode(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """UniQ-encodes a vector.

  Args:
    a: Array of any shape; treated as flat float32 (non-finite -> 0).

  Returns:
    `(codes, side)`: uint8 codes of `a`'s flattened shape and the float32
    side information `[lz_min, lz_max, gz_min, gz_max]`.
  """
  a = sanitize(a).reshape(-1)
  negative = a < 0
  lz_min, lz_max = _side_range(a, negative)
  gz_min, gz_max = _side_range(a, ~negative)
  codes = np.where(negative, _uniform_bins(a, lz_min, lz_max),
                   np.uint8(128) + _uniform_bins(a, gz_min, gz_max))
  side = np.array([lz_min, lz_max, gz_min, gz_max], dtype=np.float32)
  return codes.astype(np.uint8), side


def _uniform_dequantize(k: np.ndarray, lo: np.float32,
                        hi: np.float32) -> np.ndarray:
  # Multiplying by float32(1/127) rather than dividing by 127 keeps the TF
  # twin identical: TF's constant folding rewrites x / c as x * (1 / c).
  step = np.float32(np.float32(hi - lo) * _INV_LEVELS)
  # k (7 bits) times a float32 step is exact in float64, so k * step + lo is
  # rounded once whether or not the multiply-add is fused (TF's graph
  # optimiser fuses it on some CPUs).
  values = k.astype(np.float64) * np.float64(step) + np.float64(lo)
  return np.where(k == _LEVELS, hi, values.astype(np.float32))


def uniq_decode(codes: np.ndarray, side: np.ndarray) -> np.ndarray:
  """Inverse of `uniq_encode`: codes -> float32 (bin lower edges)."""
  codes = np.asarray(codes)
  if codes.dtype != np.uint8:
    raise ValueError(f'UniQ codes must be uint8, got {codes.dtype}.')
  side = np.asarray(side, dtype=np.float32)
  if side.shape != (UNIQ_SIDE_FLOATS,):
    raise ValueError(f'UniQ side information must have 4 floats, got '
                     f'shape {side.shape}.')
  lz_min, lz_max, gz_min, gz_max = side
  negative = codes < 128
  neg = _uniform_dequantize(codes, lz_min, lz_max)
  pos = _uniform_dequantize(codes - np.uint8(128), gz_min, gz_max)
  return np.where(negative, neg, pos).astype(np.float32)


def expq_base(a: np.ndarray) -> np.float32:
  """Returns the ExpQ base b = delta^(-1/127) as the float32 that is sent."""
  magnitudes = np.abs(sanitize(a))
  nonzero = magnitudes[magnitudes > 0]
  delta = nonzero.min() if nonzero.size else np.float32(EXPQ_MAX_DELTA)
  delta = min(float(delta), EXPQ_MAX_DELTA)
  return np.float32(np.power(np.float64(delta), -1.0 / _LEVELS))


def expq_encode(a: np.ndarray) -> tuple[np.ndarray, np.float32]:
  """ExpQ-encodes a vector.

  Args:
    a: Array of any shape; treated as flat float32 (non-finite -> 0).

  Returns:
    `(codes, base)`: uint8 codes of `a`'s flattened shape and the float32
    base b.
  """
  a = sanitize(a).reshape(-1)
  base = expq_base(a)
  magnitudes = np.abs(a).astype(np.float64)
  nonzero = magnitudes > 0
  log_base = np.log(np.float64(base))
  with np.errstate(all='ignore'):
    exponents = np.rint(np.log(np.where(nonzero, magnitudes, 1.0)) / log_base)
  levels = (-np.clip(exponents, -_LEVELS, -1)).astype(np.uint8)
  codes = np.where(a < 0, levels, np.uint8(128) + levels)
  codes = np.where(nonzero, codes, np.uint8(0))
  return codes.astype(np.uint8), base


def expq_magnitudes(base: np.float32) -> np.ndarray:
  """Returns the float32 table b^-k for k = 0..127 (entry 0 unused)."""
  exponents = -np.arange(_LEVELS + 1, dtype=np.float64)
  return np.power(np.float64(np.float32(base)), exponents).astype(np.float32)


def expq_decode(codes: np.ndarray, base: np.float32) -> np.ndarray:
  """Inverse of `expq_encode`: codes -> float32."""
  codes = np.asarray(codes)
  if codes.dtype != np.uint8:
    raise ValueError(f'ExpQ codes must be uint8, got {codes.dtype}.')
  base = np.float32(base)
  if not np.isfinite(base) or base <= 1:
    raise ValueError(f'ExpQ base must be a finite float > 1, got {base}.')
  if np.any(codes == 128):
    raise ValueError('Corrupted ExpQ payload: code 128 is never produced.')
  table = expq_magnitudes(base)
  negative = codes < 128
  levels = np.where(negative, codes, codes - np.uint8(128))
  values = np.where(negative, -table[levels], table[levels])
  return np.where(codes == 0, np.float32(0.0), values).astype(np.float32)
