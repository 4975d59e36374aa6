"""Before training, a pass at x_t over the batches the client will train on;
`upload` receives its example-weighted mean gradient Σ_b n_b g_b / Σ_b n_b.

Mime Lite's "full" gradient (Karimireddy et al., "Breaking the centralized
barrier for cross-device federated learning", NeurIPS 2021). The pass costs one
more forward/backward per trained example and counts in no training metric.
"""

import collections

import tensorflow as tf

from tff_adaptive.rounds import extension


class FullGradient(extension.Extension):
  name = 'full_gradient'
  extra_passes_per_example = 1.0
  extra_training_passes = True

  def check(self, others: tuple) -> None:
    extension.one_upload_gradient(self, others)
    if any(o.batches_per_step > 1 for o in others):
      # The pass is over single batches; a grouped step would need its own.
      raise ValueError('full_gradient takes one batch per step')

  def init_carry(self, x_t) -> dict:
    return {'full_sum': tuple(tf.zeros_like(v) for v in x_t),
            'full_examples': tf.constant(0, tf.int64)}

  def before_steps(self, carry, passes: extension.ClientPasses):
    return passes.over_batches(_add_batch, carry)

  def upload_gradient(self, carry):
    n = carry['full_examples']
    return tuple(tf.math.divide_no_nan(s, tf.cast(n, s.dtype)) for s in carry['full_sum'])


def _add_batch(carry, grads, num_examples):
  """Sums n_b·g_b and n_b in the order of TFF's Mime Lite client (g_sum + g·n),
  so that the mean is bit-identical to TFF's."""
  n = tf.cast(num_examples, tf.int64)
  carry = collections.OrderedDict(carry)
  carry['full_sum'] = tuple(s + g * tf.cast(n, g.dtype) for s, g in zip(carry['full_sum'], grads))
  carry['full_examples'] = carry['full_examples'] + n
  return carry
