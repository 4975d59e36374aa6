"""Golomb (Rice) coding of sparse-tensor index gaps for CE-FedAvg.

Implements the lossless index coding of thesis chapter 3, section 3.2
(eqs. 3.3-3.4, "the same [implementation] as used in [45]", i.e.
Sattler et al.'s Sparse Ternary Compression), read as in docs/algorithms.md#errata: the Golomb parameter
 uses logarithms (STC form),

  b* = max(0, 1 + floor(log2(ln(phi - 1) / ln(s)))),    phi = golden ratio,

and the expected number of bits per transmitted index is

  g_s = b* + 1 / (1 - s^(2^b*)).

Coding. The sorted flat indices i_0 < i_1 < ... of a tensor are turned into
gaps d_0 = i_0 + 1, d_j = i_j - i_{j-1} (all >= 1). Each gap is written as a
Rice code with M = 2^b*: v = d - 1, q = v >> b*, r = v & (M - 1); q one-bits,
a terminating zero-bit, then r in b* bits, most significant bit first. For a
Bernoulli(1 - s) keep-mask the gaps are geometric and the mean code length is
exactly g_s (a test checks this empirically).

Framing. The bitstring is packed MSB-first into bytes (`numpy.packbits`); the
exact bit length travels with it and the padding bits of the last byte must be
zero. The number of indices is not part of the stream: it is
`sparsify.num_kept(size, s)`, known to the decoder from the model shape and
the sparsity. With it, the decoder detects truncation (bits run out), excess
(bits left over), out-of-range indices and non-zero padding, and raises
`ValueError`. A corruption that happens to map one valid stream of the same
length onto another (e.g. a flipped remainder bit) cannot be detected without
redundancy, which the thesis' bit budget does not include (about 90% of
random single-bit flips go unnoticed at s = 0.9). `golomb_encode(...,
checksum=True)` adds a CRC-32 of the packed bytes (32 more bits, not part of
eqs. 3.1-3.2) that the decoder verifies, catching such corruptions too.
"""

import dataclasses
import math
from typing import Optional
import zlib

import numpy as np

GOLDEN_RATIO = (1.0 + math.sqrt(5.0)) / 2.0


def _check_sparsity(sparsity: float) -> float:
  sparsity = float(sparsity)
  if not 0.0 <= sparsity < 1.0:
    raise ValueError(f'sparsity must be in [0, 1), got {sparsity}.')
  return sparsity


def golomb_b_star(sparsity: float) -> int:
  """Returns the Golomb parameter b* for sparsity `s` (fraction dropped).

  b* = 1 + floor(log2(ln(phi - 1) / ln(s))), clamped to b* >= 0. For s = 0
  (nothing dropped, every gap is 1) the formula's limit is -inf, so b* = 0.

  Args:
    sparsity: The fraction s of values dropped, in [0, 1).
  """
  s = _check_sparsity(sparsity)
  if s == 0.0:
    return 0
  ratio = math.log(GOLDEN_RATIO - 1.0) / math.log(s)
  return max(0, 1 + math.floor(math.log2(ratio)))


def golomb_expected_bits(sparsity: float) -> float:
  """Returns g_s = b* + 1 / (1 - s^(2^b*)), the expected bits per index."""
  s = _check_sparsity(sparsity)
  b_star = golomb_b_star(s)
  return b_star + 1.0 / (1.0 - s ** (2 ** b_star))


@dataclasses.dataclass(frozen=True)
class GolombCode:
  """A Golomb-coded index set as it is transmitted.

  Attributes:
    data: The bitstring packed MSB-first into bytes; padding bits are zero.
    num_bits: The exact length of the bitstring (what is counted as sent).
    b_star: The Golomb parameter used (sent as one 32-bit value, see codec).
    crc32: Optional CRC-32 of `data` (32 extra bits when present).
  """
  data: bytes
  num_bits: int
  b_star: int
  crc32: Optional[int] = None


def _gaps(indices: np.ndarray) -> np.ndarray:
  indices = np.asarray(indices)
  if indices.ndim != 1:
    raise ValueError(f'indices must be 1-D, got shape {indices.shape}.')
  if indices.size and not np.issubdtype(indices.dtype, np.integer):
    raise ValueError(f'indices must be integers, got {indices.dtype}.')
  indices = indices.astype(np.int64)
  if indices.size and indices[0] < 0:
    raise ValueError('indices must be non-negative.')
  gaps = np.diff(indices, prepend=-1)
  if np.any(gaps < 1):
    raise ValueError('indices must be strictly increasing.')
  return gaps


def golomb_code_lengths(indices: np.ndarray, b_star: int) -> np.ndarray:
  """Returns the code length in bits of each index (without encoding)."""
  gaps = _gaps(indices)
  return ((gaps - 1) >> b_star) + 1 + b_star


def golomb_encode(indices: np.ndarray, b_star: int,
                  checksum: bool = False) -> GolombCode:
  """Golomb-encodes strictly increasing non-negative flat indices.

  Args:
    indices: 1-D integer array, strictly increasing, >= 0.
    b_star: The Golomb parameter (>= 0), normally `golomb_b_star(s)`.
    checksum: Whether to attach a CRC-32 of the packed bytes.

  Returns:
    A `GolombCode` with the packed bitstring and its exact bit length.
  """
  b_star = int(b_star)
  if b_star < 0 or b_star > 62:
    raise ValueError(f'b_star must be in [0, 62], got {b_star}.')
  values = _gaps(indices) - 1
  quotients = values >> b_star
  remainders = values & ((1 << b_star) - 1)
  lengths = quotients + 1 + b_star
  total = int(lengths.sum())
  starts = np.cumsum(lengths) - lengths
  bits = np.zeros(total, dtype=np.uint8)
  # Unary part: quotients[j] one-bits starting at starts[j]; the zero
  # terminator is already in place.
  num_ones = int(quotients.sum())
  if num_ones:
    group_starts = np.repeat(starts, quotients)
    offsets = np.arange(num_ones) - np.repeat(
        np.cumsum(quotients) - quotients, quotients)
    bits[group_starts + offsets] = 1
  for j in range(b_star):
    bits[starts + quotients + 1 + j] = (remainders >> (b_star - 1 - j)) & 1
  data = np.packbits(bits).tobytes()
  return GolombCode(data=data, num_bits=total, b_star=b_star,
                    crc32=zlib.crc32(data) if checksum else None)


def golomb_decode(code: GolombCode, num_indices: int, size: int) -> np.ndarray:
  """Decodes a `GolombCode` back to sorted flat indices.

  Args:
    code: The transmitted code.
    num_indices: How many indices the stream holds (known to the decoder
      from the tensor size and the sparsity, not transmitted).
    size: The number of elements of the tensor; every index must be < size.

  Returns:
    A 1-D int64 array of `num_indices` strictly increasing indices.

  Raises:
    ValueError: If the stream is truncated, has bits left over, decodes to an
      index >= size, has non-zero padding or inconsistent lengths, or fails
      its CRC-32 (when present).
  """
  if code.crc32 is not None and zlib.crc32(code.data) != code.crc32:
    raise ValueError('Corrupted Golomb code: CRC-32 mismatch.')
  b_star, num_bits = int(code.b_star), int(code.num_bits)
  if b_star < 0 or b_star > 62:
    raise ValueError(f'Corrupted Golomb code: b_star={b_star} out of range.')
  if num_bits < 0 or num_bits > 8 * len(code.data):
    raise ValueError(
        f'Corrupted Golomb code: num_bits={num_bits} but only '
        f'{8 * len(code.data)} bits of data.')
  if len(code.data) != (num_bits + 7) // 8:
    raise ValueError(
        f'Corrupted Golomb code: {len(code.data)} bytes for {num_bits} bits.')
  bits = np.unpackbits(np.frombuffer(code.data, dtype=np.uint8))
  if np.any(bits[num_bits:]):
    raise ValueError('Corrupted Golomb code: non-zero padding bits.')
  bits = bits[:num_bits]
  num_indices, size = int(num_indices), int(size)
  if num_indices == 0:
    if num_bits:
      raise ValueError(f'Corrupted Golomb code: {num_bits} bits left over.')
    return np.zeros(0, dtype=np.int64)

  # next_zero[p]: position of the first zero-bit at or after p (num_bits if
  # none), so each unary run is read in O(1) inside the sequential loop.
  positions = np.where(bits == 0, np.arange(num_bits), num_bits)
  next_zero = np.minimum.accumulate(positions[::-1])[::-1]
  next_zero = np.append(next_zero, num_bits).tolist()
  # remainder_at[p]: the b*-bit integer starting at p (zero-padded past end).
  padded = np.concatenate([bits.astype(np.int64), np.zeros(b_star, np.int64)])
  remainder_at = np.zeros(num_bits + 1, dtype=np.int64)
  for j in range(b_star):
    remainder_at[:num_bits] |= padded[j:j + num_bits] << (b_star - 1 - j)
  remainder_at = remainder_at.tolist()

  out = [0] * num_indices
  pos, index = 0, -1
  for j in range(num_indices):
    if pos >= num_bits:
      raise ValueError(
          f'Truncated Golomb code: bits ran out after {j} of {num_indices} '
          'indices.')
    zero = next_zero[pos]
    if zero >= num_bits:
      raise ValueError(
          f'Truncated Golomb code: unterminated unary part at index {j}.')
    quotient = zero - pos
    pos = zero + 1
    if pos + b_star > num_bits:
      raise ValueError(
          f'Truncated Golomb code: remainder of index {j} cut off.')
    index += (quotient << b_star) + remainder_at[pos] + 1
    pos += b_star
    if index >= size:
      raise ValueError(
          f'Corrupted Golomb code: index {index} >= tensor size {size}.')
    out[j] = index
  if pos != num_bits:
    raise ValueError(
        f'Corrupted Golomb code: {num_bits - pos} bits left over after '
        f'{num_indices} indices.')
  return np.asarray(out, dtype=np.int64)
