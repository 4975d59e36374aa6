"""How the cohort program runs an aggregator: its program form inside the round.

Each aggregator (`tff_adaptive.aggregators`: mean, dp, compression, robust)
owns its program form (`aggregators.base.InProgram`), which knows only Δ, the
extra upload and its own sums. This module fits the form into the round:
each client's sums (`client.client_sums`, the mean fused in) take the (Δ,
extra) its `client_part` returns and the sums it adds, and the server step
(`server.ServerRound`) takes the means its `means` computes from Σ over the
clients. Aggregators without a form (secure aggregation, factories this
package did not build) run per client: `supported` says why.
"""

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.aggregators import base
from tff_adaptive.aggregators import mean as mean_lib
from tff_adaptive.rounds import client as client_lib
from tff_adaptive.rounds import options as options_lib


def supported(options: options_lib.RoundOptions) -> Optional[str]:
  """None if the cohort program aggregates as `options` asks, else why not."""
  return options.aggregator.per_client_reason()


def for_options(options: options_lib.RoundOptions, recipe) -> 'ProgramAggregation':
  return ProgramAggregation(options.aggregator.in_program(recipe.sum_extra))


def mean(sum_extra: bool) -> 'ProgramAggregation':
  """The fused mean: the default per-client round's sums, and the program's default."""
  return ProgramAggregation(mean_lib.Mean().in_program(sum_extra))


class ProgramAggregation:
  """An aggregator's program form, called by the round: the clients' sums
  (`client_sums`), their process (`create`), the server step (`server`), and
  the new state and measurements (`after_round`)."""

  def __init__(self, form: base.InProgram):
    self.form = form

  def client_params_type(self):
    return self.form.client_params_type()

  def client_params(self, aggregator_state):
    return self.form.client_params(aggregator_state)

  def client_sums(self, result: client_lib.ClientResult, metrics, delta_structure, params=None):
    """One client's part of the round's single sum, inside the program."""
    delta = tf.nest.pack_sequence_as(delta_structure, list(result.delta))
    delta, extra, added = self.form.client_part(delta, result.extra, params)
    sums, _ = client_lib.client_sums(
        result._replace(delta=tf.nest.flatten(delta), extra=extra), metrics, fused_mean=True,
        delta_structure=delta_structure, summed_extra=self.form.sum_extra)
    if not self.form.weighted_delta:
      sums['weighted_delta'] = delta
    sums.update(added)
    return sums

  def create(self, sums_type) -> tff.templates.AggregationProcess:
    """The per-client round's process, whose `initialize` gives the state's `aggregator`."""
    return self.form.process(sums_type.weighted_delta, sums_type.weighted_extra)

  def server(self, server_round, model_weights, stats, hparams, sums):
    mean_delta, mean_extra, bits = self.form.means(sums)
    if mean_extra is None:
      mean_extra = server_round.mean_extra(sums)
    if bits is None:
      bits = tf.constant(base.NO_BITS, tf.float64)
    return server_round(model_weights, stats, hparams, sums, mean_delta, mean_extra, bits)

  def after_round(self, placement, process, aggregator_state, sums, round_metrics):
    return self.form.after_round(placement, process, aggregator_state, sums, round_metrics)
