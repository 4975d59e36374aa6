"""CE-FedAvg upload compression in TensorFlow: its encoders equal the NumPy codec
(tests/test_compression.py) exactly, and so does the encoded-sum factory."""

import math

import numpy as np
import pytest

from tff_adaptive.compression import codec
from tff_adaptive.compression import golomb
from tff_adaptive.compression import quantizers
from tff_adaptive.compression import sparsify


from test_compression import _model_deltas  # pylint: disable=g-bad-import-order


# ---------------------------------------------------------- TensorFlow side --


def test_tf_and_numpy_encoders_agree_exactly():
  tf = pytest.importorskip('tensorflow')
  from tff_adaptive.compression import tf_ops  # pylint: disable=g-import-not-at-top
  weights, moments, second = _model_deltas(10)
  weights[0].reshape(-1)[:40] = 0.0  # Ties at the top-k boundary.
  weights[4].reshape(-1)[::5] = 0.01  # Many equal magnitudes ...
  weights[4].reshape(-1)[1::10] = -0.01  # ... of both signs.
  weights[6].reshape(-1)[3] = np.nan
  moments[2].reshape(-1)[7] = np.inf
  second[4].reshape(-1)[::3] = 0.0

  for s, quantize in ((0.9, True), (0.6, True), (0.95, False), (0.0, False)):
    @tf.function
    def compress(w, m, v, s=s, quantize=quantize):
      return tf_ops.tf_sparsify_quantize(w, s, quantize, [m, v])

    out = compress(weights, moments, second)
    msg = codec.encode_upload(weights, s, quantize, [moments, second])
    assert int(out.num_bits) == msg.num_bits
    for x, y in zip(out.weights, codec.decode_upload(msg)):
      np.testing.assert_array_equal(x.numpy(), y)
    for xs, ys in zip(out.states, codec.decode_upload_states(msg)):
      for x, y in zip(xs, ys):
        np.testing.assert_array_equal(x.numpy(), y)
    if s == 0.0:  # Identity, apart from non-finite -> 0.
      for x, w in zip(out.weights, weights):
        np.testing.assert_array_equal(x.numpy(), np.nan_to_num(w, posinf=0,
                                                               neginf=0))

  # Indices, codes and side information themselves (eager).
  for w, m, v, t in zip(weights, moments, second,
                        codec.encode_upload(weights, 0.9, True,
                                            [moments, second]).tensors):
    enc = tf_ops.tf_encode_tensor(tf.constant(w), 0.9, True,
                                  [tf.constant(m), tf.constant(v)])
    if t.index_code is None:
      assert enc.indices is None
    else:
      np.testing.assert_array_equal(
          enc.indices.numpy(),
          golomb.golomb_decode(t.index_code, enc.indices.shape[0], w.size))
    np.testing.assert_array_equal(enc.weight_payload.numpy(), t.weights.data)
    np.testing.assert_array_equal(enc.weight_side.numpy(), t.weights.side)
    for payload, base, q in zip(enc.state_payloads, enc.state_bases,
                                t.states):
      np.testing.assert_array_equal(payload.numpy(), q.data)
      assert base.numpy() == q.side[0]


def test_encoded_sum_factory_matches_numpy_codec():
  pytest.importorskip('tensorflow')
  tff = pytest.importorskip('tensorflow_federated')
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  from tff_adaptive.compression import encoding_stages  # pylint: disable=g-import-not-at-top
  s = 0.9
  factory = encoding_stages.compressed_sum_factory(s)
  process = factory.create(
      tff.types.to_type([(np.float32, (40, 30)), (np.float32, (30,))]))
  rng = np.random.default_rng(13)
  clients = [[rng.normal(size=(40, 30)).astype(np.float32),
              rng.normal(size=(30,)).astype(np.float32)] for _ in range(3)]
  # TFF's default context leaves its worker_binary running; this one is
  # tracked and stopped.
  runtime.use_local_cpp_context()
  try:
    output = process.next(process.initialize(), clients)
  finally:
    runtime.shutdown_workers()
  decoded = [codec.decode_upload(codec.encode_upload(c, s, True))
             for c in clients]
  for i in range(2):
    expected = np.sum([d[i] for d in decoded], axis=0)
    np.testing.assert_allclose(np.asarray(output.result[i]), expected,
                               rtol=1e-6, atol=1e-7)
  # The sparse tensor really is sparse: at most 3 * 120 nonzeros of 1200.
  assert np.count_nonzero(np.asarray(output.result[0])) <= 3 * 120
