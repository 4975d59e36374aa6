"""The server step assumes every client ran exactly K local steps (FedGBO's
inverse step): K must be at least 1, and a round in which a client ran fewer
fails loudly instead of dividing by the wrong count."""

import tensorflow as tf

from tff_adaptive.rounds import extension


class EqualLocalSteps(extension.Extension):
  name = 'equal_local_steps'
  min_local_steps = 1

  def server_checks(self, recipe, sums) -> list:
    # All K_i equal ⇔ n·ΣK_i² = (ΣK_i)² (Cauchy–Schwarz), exact in int64.
    return [tf.debugging.assert_equal(
        sums['clients'] * sums['local_steps_squared'], sums['local_steps'] ** 2,
        message=f'{recipe.name} needs every client to run the same number of local '
                'steps K (its server step inverts K identical steps); a client ran fewer: '
                'check for clients with no data')]
