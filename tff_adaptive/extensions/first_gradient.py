"""`upload` receives the gradient of the client's first local step (MimeXlite).

Karimireddy et al. 2021's Mime uses a gradient at x_t: the first step's is
the cheap choice (MimeXlite); `full_gradient.py` makes the full pass.
"""

import tensorflow as tf

from tff_adaptive.rounds import extension


class FirstGradient(extension.Extension):
  name = 'first_gradient'

  def check(self, others: tuple) -> None:
    extension.one_upload_gradient(self, others)

  def init_carry(self, x_t) -> dict:
    return {'g0': tuple(tf.zeros_like(v) for v in x_t)}

  def after_step(self, carry, stepped, step):
    if step.branchless:
      g0 = tuple(tf.where(step.is_first, g, old) for g, old in zip(step.grads, carry['g0']))
    else:
      # A cond, not tf.where: no copy of the model-sized gradient per step.
      g0 = tf.cond(step.is_first, lambda: step.grads, lambda: carry['g0'])
    stepped['g0'] = g0
    return stepped

  def upload_gradient(self, carry):
    return carry['g0']
