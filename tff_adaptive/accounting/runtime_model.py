"""The thesis's wall-clock model of a round (thesis §5.1.2, eqs. 5.3-5.5; numbers of §5.2.2).

A round lasts, for the slowest client, download + K·β + upload seconds: the
model bin/train's schedule driver uses for `sim/round_seconds` (with the bits
the process measured) and the reproduction of thesis Table 5.4 uses (with the
thesis's model sizes).
"""

import math
from collections.abc import Sequence
from typing import Optional, Union

import numpy as np

BITS_PER_FLOAT = 32
DEFAULT_DOWN_MBPS = 20.0  # Thesis §5.2.2: 4G LTE in the UK.
DEFAULT_UP_MBPS = 5.0

FloatOrArray = Union[float, Sequence[float], np.ndarray]


def floats_to_mbit(num_floats: Union[int, float]) -> float:
  """Size of `num_floats` 32-bit floats in megabits (10**6 bits)."""
  return num_floats * BITS_PER_FLOAT / 1e6


def client_round_seconds(down_bits: FloatOrArray, up_bits: FloatOrArray, k: FloatOrArray,
                         beta: FloatOrArray, down_mbps: FloatOrArray = DEFAULT_DOWN_MBPS,
                         up_mbps: FloatOrArray = DEFAULT_UP_MBPS):
  """Thesis eq. 5.3 for one client: |x|/D + K β + |x|/U, with the bits actually sent.

  Args broadcast (NumPy) over clients.
  """
  return down_bits / 1e6 / down_mbps + k * beta + up_bits / 1e6 / up_mbps


def simulated_round_seconds(num_params: int,
                            k_per_client: Union[int, Sequence[int]],
                            beta: FloatOrArray,
                            down_mbps: FloatOrArray = DEFAULT_DOWN_MBPS,
                            up_mbps: FloatOrArray = DEFAULT_UP_MBPS,
                            down_floats: Optional[int] = None,
                            up_floats: Optional[int] = None) -> float:
  """Wall-clock time of one round, thesis eqs. 5.3-5.4.

  W_r = max over clients c of |x|/D^c + K_r^c beta^c + |x|/U^c, the server
  waiting for the slowest client.  `k_per_client`, `beta`, `down_mbps` and
  `up_mbps` broadcast over clients (scalars for the thesis' homogeneous model).

  Args:
    num_params: |x| in floats (32 bits each).
    k_per_client: local steps per client.
    beta: seconds per minibatch step per client (thesis Table 5.2).
    down_mbps: download bandwidth D in Mbit/s (default 20).
    up_mbps: upload bandwidth U in Mbit/s (default 5).
    down_floats: floats downloaded if not |x| (e.g. FedGBO's |x| + |s|).
    up_floats: floats uploaded if not |x| (e.g. MFL's |x| + |s|).
  """
  down_bits = (num_params if down_floats is None else down_floats) * BITS_PER_FLOAT
  up_bits = (num_params if up_floats is None else up_floats) * BITS_PER_FLOAT
  k, b, d, u = np.broadcast_arrays(
      np.asarray(k_per_client, dtype=np.float64), np.asarray(beta, dtype=np.float64),
      np.asarray(down_mbps, dtype=np.float64), np.asarray(up_mbps, dtype=np.float64))
  return float(np.max(client_round_seconds(down_bits, up_bits, k, b, d, u)))


def simulated_total_seconds(num_params: int, k_sequence: Sequence[int], beta: float,
                            down_mbps: float = DEFAULT_DOWN_MBPS,
                            up_mbps: float = DEFAULT_UP_MBPS,
                            down_floats: Optional[int] = None,
                            up_floats: Optional[int] = None) -> float:
  """Thesis eq. 5.5: sum over rounds of the homogeneous round time."""
  return math.fsum(
      simulated_round_seconds(num_params, k, beta, down_mbps, up_mbps, down_floats,
                              up_floats) for k in k_sequence)
