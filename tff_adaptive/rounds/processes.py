"""What both executions build around their round: the process and its client inputs.

  finish_process              the `LearningProcess` (or the process of clients
                              that keep state) with TFF's accessors
  client_state_arguments      the arguments of a process whose clients keep state
  check_client_state_options  the options such a recipe refuses
  client_data_type            a client's input: its dataset[, test][, private]
  iterates                    whether client loops iterate their datasets
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.rounds import layout
from tff_adaptive.rounds import options as options_lib
from tff_adaptive.rounds import stateful


def finish_process(initialize_fn, next_fn, state_type, info, recipe, process_class=None, **kwargs):
  """The `LearningProcess` around `next_fn` with TFF's weight and hparam accessors."""
  get_model_weights, set_model_weights = layout.model_weights_fns(state_type.member,
                                                                  info.weights_type)
  get_hparams_fn, set_hparams_fn = layout.hparams_fns(state_type.member, recipe)
  process_class = process_class or tff.learning.templates.LearningProcess
  return process_class(initialize_fn, next_fn, get_model_weights, set_model_weights,
                       get_hparams_fn=get_hparams_fn, set_hparams_fn=set_hparams_fn, **kwargs)


def check_client_state_options(recipe, options: options_lib.RoundOptions) -> None:
  if recipe.has_client_state and options.upload_compression is not None:
    raise ValueError(f'{recipe.name}: upload_compression is not available for an algorithm '
                     'whose clients keep state (its extra upload is summed, not compressed)')


def client_state_arguments(recipe, info) -> dict:
  """`stateful.StatefulClientsProcess`'s client-state arguments, for both executions."""
  if not recipe.has_client_state:  # clients that only measure UA keep nothing
    return dict(client_state_initial=collections.OrderedDict(), client_state_structure=(),
                name=recipe.name)
  structure = info.initial_client_state()
  return dict(client_state_initial=stateful.flat_state(
      tf.nest.map_structure(np.asarray, structure), recipe.client_state_leaf_names(structure)),
              client_state_structure=structure, name=recipe.name)


def client_data_type(recipe, info) -> tff.Type:
  """A client's input: its dataset, or OrderedDict(train=[, test=][, private=])."""
  dataset_type = tff.SequenceType(info.element_type)
  if not recipe.has_client_output:
    return dataset_type
  fields = [('train', dataset_type)]
  for ext in recipe.extensions:
    fields += ext.input_fields(info)
  if recipe.has_client_state:
    fields.append(('private', tff.tensorflow.computation(
        info.initial_client_state).type_signature.result))
  return tff.StructWithPythonType(fields, collections.OrderedDict)


def iterates(options: options_lib.RoundOptions) -> bool:
  """Whether client loops iterate their datasets (TFF's DATASET_ITERATOR, the default)."""
  return (options.loop_implementation or tff.learning.LoopImplementation.DATASET_ITERATOR
          ) == tff.learning.LoopImplementation.DATASET_ITERATOR
