"""CE-FedAvg upload compression (thesis chapter 3): NumPy reference codec.

`golomb`, `quantizers`, `sparsify` and `codec` need only NumPy. The TensorFlow
twins live in `tf_ops` (graph-mode functions) and `encoding_stages`
(tensor_encoding stages for `tff.aggregators.EncodedSumFactory`); import them
explicitly, this package does not import TensorFlow.
"""

from tff_adaptive.compression.codec import analytic_bits_ce_fedavg
from tff_adaptive.compression.codec import analytic_bits_fedavg
from tff_adaptive.compression.codec import compression_ratio_ce_fedavg
from tff_adaptive.compression.codec import compression_ratio_fedavg
from tff_adaptive.compression.codec import decode_upload
from tff_adaptive.compression.codec import decode_upload_states
from tff_adaptive.compression.codec import encode_upload
from tff_adaptive.compression.codec import EncodedMessage
from tff_adaptive.compression.codec import EncodedTensor
from tff_adaptive.compression.codec import message_compression_ratio
from tff_adaptive.compression.codec import nominal_compression_ratio_ce_fedavg
from tff_adaptive.compression.codec import nominal_compression_ratio_fedavg
from tff_adaptive.compression.codec import uncompressed_bits_ce_fedavg
from tff_adaptive.compression.codec import uncompressed_bits_fedavg
from tff_adaptive.compression.golomb import golomb_b_star
from tff_adaptive.compression.golomb import golomb_decode
from tff_adaptive.compression.golomb import golomb_encode
from tff_adaptive.compression.golomb import golomb_expected_bits
from tff_adaptive.compression.golomb import GolombCode
from tff_adaptive.compression.quantizers import expq_decode
from tff_adaptive.compression.quantizers import expq_encode
from tff_adaptive.compression.quantizers import uniq_decode
from tff_adaptive.compression.quantizers import uniq_encode
from tff_adaptive.compression.sparsify import num_kept
from tff_adaptive.compression.sparsify import sparsify_shared
