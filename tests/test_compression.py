"""Tests for the CE-FedAvg upload compression (thesis ch. 3, SPEC section 6)."""

import math

import numpy as np
import pytest

from tff_adaptive.compression import codec
from tff_adaptive.compression import golomb
from tff_adaptive.compression import quantizers
from tff_adaptive.compression import sparsify

# A small CNN-like model: conv 3x3x1x32, conv 3x3x32x64, dense 1600x48, dense
# 48x10 with biases; 96,154 parameters, 8 tensors (4 of them rank 1).
MODEL_SHAPES = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (1600, 48),
                (48,), (48, 10), (10,)]


def _model_deltas(seed):
  rng = np.random.default_rng(seed)
  weights = [(rng.normal(size=s) * 1e-2).astype(np.float32)
             for s in MODEL_SHAPES]
  moments = [(rng.normal(size=s) * 1e-3).astype(np.float32)
             for s in MODEL_SHAPES]
  # Second-moment deltas: both signs, magnitudes over many decades.
  second = [(rng.choice([-1.0, 1.0], size=s) *
             10.0**rng.uniform(-12, -4, size=s)).astype(np.float32)
            for s in MODEL_SHAPES]
  return weights, moments, second


# ----------------------------------------------------------------- Golomb ---


@pytest.mark.parametrize('s,b_star,g_s', [(0.6, 0, 2.5), (0.9, 3, 4.756),
                                          (0.95, 4, 5.786)])
def test_golomb_parameter_and_expected_bits(s, b_star, g_s):
  assert golomb.golomb_b_star(s) == b_star
  assert round(golomb.golomb_expected_bits(s), 3) == g_s


def test_golomb_b_star_is_clamped_at_zero():
  # 1 + floor(log2(ln(0.618)/ln(0.1))) = 1 + floor(log2(0.209)) = -2 -> 0.
  assert golomb.golomb_b_star(0.1) == 0
  assert golomb.golomb_b_star(0.0) == 0
  assert golomb.golomb_expected_bits(0.0) == 1.0  # Every gap is 1: one bit.
  with pytest.raises(ValueError):
    golomb.golomb_b_star(1.0)


@pytest.mark.parametrize('s', [0.6, 0.9, 0.95])
def test_golomb_mean_bits_match_expected_on_bernoulli_masks(s):
  rng = np.random.default_rng(7)
  n = 400_000
  indices = np.flatnonzero(rng.random(n) < 1.0 - s)
  code = golomb.golomb_encode(indices, golomb.golomb_b_star(s))
  mean_bits = code.num_bits / indices.size
  assert mean_bits == pytest.approx(golomb.golomb_expected_bits(s), rel=0.01)
  assert code.num_bits == golomb.golomb_code_lengths(
      indices, code.b_star).sum()
  assert len(code.data) == math.ceil(code.num_bits / 8)


def test_golomb_known_bitstring():
  # b* = 2: gaps 1, 6, 1 -> values 0, 5, 0 -> '0 00', '10 01', '0 00'.
  code = golomb.golomb_encode(np.array([0, 6, 7]), 2)
  assert code.num_bits == 10
  bits = ''.join(str(b) for b in np.unpackbits(
      np.frombuffer(code.data, np.uint8))[:10])
  assert bits == '0001001000'


def test_golomb_round_trip_is_lossless():
  rng = np.random.default_rng(3)
  cases = [np.zeros(0, np.int64), np.array([0]), np.array([999]),
           np.array([0, 1, 2, 3]), np.array([5, 900, 901, 999])]
  for _ in range(30):
    n = int(rng.integers(1, 5000))
    k = int(rng.integers(1, n + 1))
    cases.append(np.sort(rng.choice(n, size=k, replace=False)))
  for indices in cases:
    size = int(indices.max()) + 1 + 3 if indices.size else 10
    for b_star in (0, 1, 3, 7):
      code = golomb.golomb_encode(indices, b_star)
      decoded = golomb.golomb_decode(code, indices.size, size)
      np.testing.assert_array_equal(decoded, indices)


def test_golomb_rejects_invalid_indices():
  with pytest.raises(ValueError):
    golomb.golomb_encode(np.array([3, 3]), 1)
  with pytest.raises(ValueError):
    golomb.golomb_encode(np.array([4, 2]), 1)
  with pytest.raises(ValueError):
    golomb.golomb_encode(np.array([-1, 2]), 1)


def _repack(bits, num_bits, b_star):
  return golomb.GolombCode(np.packbits(bits[:num_bits]).tobytes(), num_bits,
                           b_star)


def test_golomb_truncated_input_raises():
  rng = np.random.default_rng(11)
  indices = np.sort(rng.choice(10_000, size=1_000, replace=False))
  code = golomb.golomb_encode(indices, 3)
  bits = np.unpackbits(np.frombuffer(code.data, np.uint8))
  for cut in (1, 2, 3, 4, 50, code.num_bits - 1):
    with pytest.raises(ValueError, match='Truncated|Corrupted'):
      golomb.golomb_decode(_repack(bits, code.num_bits - cut, 3), 1_000,
                           10_000)
  # Fewer bytes than the stated length.
  with pytest.raises(ValueError, match='Corrupted'):
    golomb.golomb_decode(
        golomb.GolombCode(code.data[:-2], code.num_bits, 3), 1_000, 10_000)
  # Claiming more indices than were encoded runs out of bits.
  with pytest.raises(ValueError, match='Truncated'):
    golomb.golomb_decode(code, 1_001, 10_000)


def test_golomb_corrupted_input_raises():
  rng = np.random.default_rng(12)
  indices = np.sort(rng.choice(10_000, size=1_000, replace=False))
  code = golomb.golomb_encode(indices, 3)
  bits = np.unpackbits(np.frombuffer(code.data, np.uint8))[:code.num_bits]
  # Trailing garbage.
  extended = np.concatenate([bits, [1, 0, 1, 1]]).astype(np.uint8)
  with pytest.raises(ValueError, match='left over'):
    golomb.golomb_decode(_repack(extended, extended.size, 3), 1_000, 10_000)
  # Fewer indices than encoded leaves bits over.
  with pytest.raises(ValueError, match='left over'):
    golomb.golomb_decode(code, 999, 10_000)
  # An index beyond the tensor.
  with pytest.raises(ValueError, match='>= tensor size'):
    golomb.golomb_decode(code, 1_000, int(indices[-1]))
  # Non-zero padding bits.
  if code.num_bits % 8:
    data = bytearray(code.data)
    data[-1] |= 1
    with pytest.raises(ValueError, match='padding'):
      golomb.golomb_decode(golomb.GolombCode(bytes(data), code.num_bits, 3),
                           1_000, 10_000)
  # Single bit flips: either detected, or decoded to a valid index set (a
  # flipped remainder bit can map one valid stream onto another).
  detected = 0
  for position in rng.choice(code.num_bits, size=200, replace=False):
    flipped = bits.copy()
    flipped[position] ^= 1
    try:
      out = golomb.golomb_decode(_repack(flipped, code.num_bits, 3), 1_000,
                                 10_000)
    except ValueError:
      detected += 1
      continue
    assert out.size == 1_000 and np.all(np.diff(out) > 0)
    assert out[0] >= 0 and out[-1] < 10_000
    assert not np.array_equal(out, indices)
  # Flips in the unary parts shift the framing and are caught; remainder-bit
  # flips are not (no redundancy in the thesis' budget).
  assert 10 <= detected < 200
  # With the optional CRC-32 every flip is caught.
  checked = golomb.golomb_encode(indices, 3, checksum=True)
  assert checked.data == code.data
  np.testing.assert_array_equal(
      golomb.golomb_decode(checked, 1_000, 10_000), indices)
  for position in rng.choice(code.num_bits, size=50, replace=False):
    flipped = bits.copy()
    flipped[position] ^= 1
    corrupted = _repack(flipped, code.num_bits, 3)
    with pytest.raises(ValueError, match='Corrupted|Truncated'):
      golomb.golomb_decode(
          golomb.GolombCode(corrupted.data, code.num_bits, 3, checked.crc32),
          1_000, 10_000)


# -------------------------------------------------------------------- UniQ --


def test_uniq_error_bound_and_exact_endpoints():
  rng = np.random.default_rng(0)
  a = np.concatenate([rng.normal(size=5000) * 0.03,
                      rng.uniform(1e-4, 2.0, size=3000),
                      -rng.exponential(0.5, size=3000)]).astype(np.float32)
  codes, side = quantizers.uniq_encode(a)
  decoded = quantizers.uniq_decode(codes, side)
  lz_min, lz_max, gz_min, gz_max = side
  neg = a < 0
  assert (lz_min, lz_max) == (a[neg].min(), a[neg].max())
  assert (gz_min, gz_max) == (a[~neg].min(), a[~neg].max())
  assert np.all(codes[neg] <= 127) and np.all(codes[~neg] >= 128)
  assert {0, 127, 128, 255} <= set(codes.tolist())
  for mask, lo, hi in ((neg, lz_min, lz_max), (~neg, gz_min, gz_max)):
    step = (float(hi) - float(lo)) / 127
    err = a[mask].astype(np.float64) - decoded[mask]
    # Lower edge of the bin: never above the input (up to one ulp), less
    # than one step below it (up to float32 rounding of the bin edges).
    assert err.min() >= -np.spacing(np.abs(a[mask])).max()
    assert err.max() < step * (1 + 1e-5)
    assert err.max() > 0.5 * step  # The bound is not vacuous.
    for endpoint in (lo, hi):
      assert decoded[mask][a[mask] == endpoint][0] == endpoint


def test_uniq_edge_cases():
  # Zeros decode to exactly zero; non-finite values become zero first.
  a = np.array([0.0, 0.5, 1.0, -2.0, -1.0, np.nan, np.inf, -np.inf],
               np.float32)
  codes, side = quantizers.uniq_encode(a)
  decoded = quantizers.uniq_decode(codes, side)
  np.testing.assert_array_equal(decoded[[0, 5, 6, 7]], 0.0)
  np.testing.assert_array_equal(decoded[[2, 3, 4]], [1.0, -2.0, -1.0])
  # One-sided and constant inputs.
  for a in (np.full(5, -0.25, np.float32), np.full(5, 3.0, np.float32),
            np.array([1e-30, 2e-30], np.float32)):
    codes, side = quantizers.uniq_encode(a)
    assert side.dtype == np.float32 and side.shape == (4,)
    np.testing.assert_array_equal(quantizers.uniq_decode(codes, side), a)
  with pytest.raises(ValueError):
    quantizers.uniq_decode(np.zeros(3, np.int32), np.zeros(4, np.float32))


# -------------------------------------------------------------------- ExpQ --


def test_expq_relative_error_and_base():
  rng = np.random.default_rng(1)
  magnitudes = 10.0**rng.uniform(-30, 0.5, size=20_000)
  a = (rng.choice([-1.0, 1.0], size=magnitudes.size) *
       magnitudes).astype(np.float32)
  a[:100] = 0.0
  codes, base = quantizers.expq_encode(a)
  delta = np.abs(a[a != 0]).min()
  assert base == np.float32(float(delta)**(-1 / 127))
  decoded = quantizers.expq_decode(codes, base)
  nonzero = a != 0
  np.testing.assert_array_equal(decoded[~nonzero], 0.0)
  np.testing.assert_array_equal(codes[~nonzero], 0)
  assert np.all(np.sign(decoded[nonzero]) == np.sign(a[nonzero]))
  b = float(base)
  in_range = nonzero & (np.abs(a) <= 1 / b)
  ratio = decoded[in_range].astype(np.float64) / a[in_range]
  # Nearest exponent: within half a base step in log space.
  assert ratio.max() <= b**0.5 * (1 + 1e-5)
  assert ratio.min() >= b**-0.5 * (1 - 1e-5)
  assert ratio.max() > b**0.4  # Not vacuous: the grid is coarse.
  # The smallest magnitude is reproduced (to float32 precision of b^127).
  smallest = np.abs(a) == delta
  assert np.allclose(np.abs(decoded[smallest]), delta, rtol=2e-5)
  # Larger magnitudes saturate at 1/b.
  saturated = np.abs(a) > 1 / b * b**0.5
  assert saturated.any()
  np.testing.assert_allclose(np.abs(decoded[saturated]), 1 / b, rtol=1e-6)


def test_expq_codes_do_not_collide():
  rng = np.random.default_rng(2)
  a = (rng.choice([-1.0, 1.0], size=5000) *
       10.0**rng.uniform(-20, -1, size=5000)).astype(np.float32)
  a[::50] = 0.0
  codes, base = quantizers.expq_encode(a)
  assert np.all((codes[a < 0] >= 1) & (codes[a < 0] <= 127))
  assert np.all(codes[a > 0] >= 129)
  assert np.all(codes[a == 0] == 0)
  assert not np.any(codes == 128)
  # Every code decodes to a distinct value, ordered like the inputs.
  all_codes = np.array([c for c in range(256) if c != 128], np.uint8)
  table = quantizers.expq_decode(all_codes, base)
  assert np.unique(table).size == table.size
  order = np.argsort(a, kind='stable')
  assert np.all(np.diff(quantizers.expq_decode(codes, base)[order]) >= 0)
  with pytest.raises(ValueError):
    quantizers.expq_decode(np.array([128], np.uint8), base)


def test_expq_degenerate_inputs():
  codes, base = quantizers.expq_encode(np.zeros(4, np.float32))
  np.testing.assert_array_equal(codes, 0)
  assert base > 1
  # All magnitudes >= 1: delta is capped, values saturate, nothing blows up.
  a = np.array([1.0, -2.0, 3.0, np.nan], np.float32)
  codes, base = quantizers.expq_encode(a)
  decoded = quantizers.expq_decode(codes, base)
  assert np.all(np.isfinite(decoded)) and base > 1
  np.testing.assert_array_equal(np.sign(decoded), [1, -1, 1, 0])


# -------------------------------------------------------------- Sparsify ---


def test_num_kept():
  assert sparsify.num_kept(100, 0.6) == 40
  assert sparsify.num_kept(1000, 0.9) == 100
  assert sparsify.num_kept(288, 0.9) == 29  # ceil(28.8)
  assert sparsify.num_kept(7, 0.0) == 7
  assert sparsify.num_kept(3, 0.95) == 1


def test_sparsify_keeps_largest_and_dense_rank1():
  rng = np.random.default_rng(4)
  x = rng.normal(size=(30, 20)).astype(np.float32)
  x[0, 0] = np.nan  # Non-finite -> 0, never among the largest.
  indices, values = sparsify.sparsify(x, 0.9)
  assert indices.size == 60 and np.all(np.diff(indices) > 0)
  flat = np.abs(np.nan_to_num(x).reshape(-1))
  dropped = np.setdiff1d(np.arange(flat.size), indices)
  assert flat[indices].min() >= flat[dropped].max()
  assert 0 not in indices
  np.testing.assert_array_equal(values, x.reshape(-1)[indices])
  bias_indices, bias_values = sparsify.sparsify(x[0, 1:], 0.9)
  assert bias_indices is None and bias_values.size == 19


def test_shared_indices_zero_states_where_weights_dropped():
  weights, moments, second = _model_deltas(5)
  for quantize in (False, True):
    msg = codec.encode_upload(weights, 0.9, quantize, [moments, second])
    dw = codec.decode_upload(msg)
    dm, dv = codec.decode_upload_states(msg)
    for w, w_hat, m, m_hat, v, v_hat in zip(weights, dw, moments, dm, second,
                                            dv):
      kept = w_hat != 0
      if w.ndim >= 2:
        assert kept.sum() == sparsify.num_kept(w.size, 0.9)
        # Kept = top |delta-omega|, and m, v follow delta-omega's indices.
        assert np.abs(w[kept]).min() >= np.abs(w[~kept]).max()
      else:
        assert kept.all()
      np.testing.assert_array_equal(m_hat[~kept], 0.0)
      np.testing.assert_array_equal(v_hat[~kept], 0.0)
      assert np.all(m_hat[kept] != 0) and np.all(v_hat[kept] != 0)
      if not quantize:
        np.testing.assert_array_equal(m_hat[kept], m[kept])
        np.testing.assert_array_equal(v_hat[kept], v[kept])


# ------------------------------------------------------- Codec and ratios --


def test_nominal_ratios():
  assert round(codec.nominal_compression_ratio_fedavg(0.6), 2) == 7.62
  assert round(codec.nominal_compression_ratio_ce_fedavg(0.6), 2) == 9.06
  assert round(codec.nominal_compression_ratio_fedavg(0.9), 2) == 25.09
  assert round(codec.nominal_compression_ratio_ce_fedavg(0.9), 2) == 33.38


def test_analytic_bits():
  # s = 0.6: g_s = 2.5. 160*8 + 0.4*10.5*1000 = 5480; 224*8 + 0.4*26.5*1000.
  assert codec.analytic_bits_fedavg(1000, 8, 0.6) == pytest.approx(5480)
  assert codec.analytic_bits_ce_fedavg(1000, 8, 0.6) == pytest.approx(12392)
  assert codec.uncompressed_bits_fedavg(1000) == 32_000
  assert codec.uncompressed_bits_ce_fedavg(1000) == 96_000
  assert codec.compression_ratio_fedavg(1000, 8, 0.6) == pytest.approx(
      32_000 / 5480)
  # The |W| term vanishes for large models.
  assert codec.compression_ratio_ce_fedavg(10**9, 8, 0.9) == pytest.approx(
      codec.nominal_compression_ratio_ce_fedavg(0.9), rel=1e-6)


@pytest.mark.parametrize('s', [0.6, 0.9, 0.95])
def test_measured_bits_match_analytic_and_nominal(s):
  weights, moments, second = _model_deltas(6)
  num_params = sum(w.size for w in weights)
  assert 90_000 < num_params < 110_000
  fedavg = codec.encode_upload(weights, s, True)
  ce = codec.encode_upload(weights, s, True, [moments, second])
  for msg, analytic, nominal in (
      (fedavg, codec.analytic_bits_fedavg,
       codec.nominal_compression_ratio_fedavg),
      (ce, codec.analytic_bits_ce_fedavg,
       codec.nominal_compression_ratio_ce_fedavg)):
    assert sum(msg.bits_breakdown().values()) == msg.num_bits
    assert msg.num_bits == pytest.approx(
        analytic(num_params, len(weights), s), rel=0.025)
    if s in (0.6, 0.9):
      assert codec.message_compression_ratio(msg) == pytest.approx(
          nominal(s), rel=0.03)
  # Recount the CE message from its parts.
  expected = 0
  for w, t in zip(weights, ce.tensors):
    k = sparsify.num_kept(w.size, s) if w.ndim >= 2 else w.size
    if w.ndim >= 2:
      idx = golomb.golomb_decode(t.index_code, k, w.size)
      expected += golomb.golomb_code_lengths(idx, t.index_code.b_star).sum()
      expected += 32  # b*
    expected += 3 * 8 * k + 32 * (4 + 1 + 1)
  assert ce.num_bits == expected
  with_crc = codec.encode_upload(weights, s, True, [moments, second],
                                 index_checksum=True)
  assert with_crc.num_bits == ce.num_bits + 32 * 4  # 4 sparse tensors.
  np.testing.assert_array_equal(codec.decode_upload(with_crc)[4],
                                codec.decode_upload(ce)[4])


def test_quantisation_off_and_zero_sparsity_is_identity():
  weights, moments, second = _model_deltas(8)
  msg = codec.encode_upload(weights, 0.0, False, [moments, second])
  assert all(t.index_code is None for t in msg.tensors)
  num_params = sum(w.size for w in weights)
  assert msg.num_bits == 96 * num_params
  for x, y in zip(weights, codec.decode_upload(msg)):
    assert y.dtype == np.float32
    np.testing.assert_array_equal(x, y)
  for xs, ys in zip((moments, second), codec.decode_upload_states(msg)):
    for x, y in zip(xs, ys):
      np.testing.assert_array_equal(x, y)
  # A tiny s that still keeps everything is sent dense too.
  assert codec.encode_upload(weights, 1e-9, False).num_bits == 32 * num_params


def test_decode_rejects_corrupted_message():
  weights, _, _ = _model_deltas(9)
  msg = codec.encode_upload(weights, 0.9, True)
  t = msg.tensors[4]
  bad = codec.EncodedTensor(t.shape, t.index_code, codec.QuantizedValues(
      t.weights.kind, t.weights.data[:-1], t.weights.side), t.states)
  broken = codec.EncodedMessage(msg.sparsity, msg.tensors[:4] + (bad,))
  with pytest.raises(ValueError, match='values for'):
    codec.decode_upload(broken)
  code = t.index_code
  truncated = codec.EncodedTensor(
      t.shape, golomb.GolombCode(code.data[:-4], code.num_bits - 32,
                                 code.b_star), t.weights, t.states)
  with pytest.raises(ValueError):
    codec.decode_upload(codec.EncodedMessage(msg.sparsity, (truncated,)))
