"""The papers' models: parameter counts as the papers state them.

Only Keras models are built here (no data, no TFF computation), so the large
ones (ResNet-18, the Stack Overflow LSTM) cost seconds.
"""

import pytest

from tasks import leaf
from tasks import tff_native
from tasks.models import recurrent
from tasks.models import thesis_models

# (builder, parameters stated by the papers)
PAPER_COUNTS = {
    'EMNIST CR CNN (FedOpt)': (lambda: tff_native.create_emnist_character_model('cnn_dropout'),
                               1_206_590),
    'EMNIST AE (FedOpt)': (tff_native.create_emnist_autoencoder_model, 2_837_314),
    'Shakespeare LSTM (FedOpt)': (lambda: tff_native.create_shakespeare_character_model('lstm'),
                                  820_522),
    'SO NWP (FedOpt)': (lambda: tff_native.create_stackoverflow_word_model(10_000), 4_050_748),
    'SO LR (FedOpt)': (lambda: tff_native.create_stackoverflow_logistic_regression(10_000, 500),
                       5_000_500),
    'CIFAR100 CNN (the FedGBO paper)': (lambda: tff_native.create_cifar100_model('fedgbo_cnn'), 1_250_852),
    'FEMNIST CNN (the FedGBO paper)': (lambda: tff_native.create_emnist_character_model('fedgbo_cnn'),
                               870_334),
    'FEMNIST DNN (thesis)': (thesis_models.create_femnist_dnn, 209_662),
    'Sent140 linear (thesis)': (thesis_models.create_sent140_linear, 10_002),
    'Shakespeare GRU (thesis, the FedGBO paper)': (
        lambda: recurrent.create_gru_char_model(len(leaf.SHAKESPEARE_VOCAB), 80, 128), 162_887),
}


@pytest.mark.parametrize('name', sorted(PAPER_COUNTS))
def test_paper_parameter_counts(name):
  build, expected = PAPER_COUNTS[name]
  assert build().count_params() == expected


def test_leaf_shakespeare_vocabulary_is_the_papers_79_symbols():
  # The FedGBO paper / thesis: "a vocabulary size of 79"; LEAF's 80 letters minus '\n'.
  assert len(leaf.SHAKESPEARE_VOCAB) == 79
  assert len(set(leaf.SHAKESPEARE_VOCAB)) == 79
  assert '\n' not in leaf.SHAKESPEARE_VOCAB and ' ' in leaf.SHAKESPEARE_VOCAB


def test_thesis_chapter_3_models_follow_its_description():
  # MNIST-2NN: two 200-unit layers; MNIST-CNN: McMahan et al.'s CNN (5x5 'same').
  assert thesis_models.create_mnist_2nn().count_params() == 784 * 200 + 200 + 200 * 200 + 200 + 2010
  cnn = thesis_models.create_mnist_cnn()
  conv_shapes = [tuple(l.kernel.shape) for l in cnn.layers if 'conv' in l.name]
  assert conv_shapes == [(5, 5, 1, 32), (5, 5, 32, 64)]
  assert cnn.count_params() == 1_663_370
  cifar = thesis_models.create_cifar10_cnn()
  filters = [l.filters for l in cifar.layers if 'conv' in l.name]
  assert filters == [32, 32, 64, 64, 128, 128]
  assert sum('batch_normalization' in l.name for l in cifar.layers) == 6
  assert [l.rate for l in cifar.layers if 'dropout' in l.name] == [0.2, 0.3, 0.4]


def test_mtfl_models_carry_batch_norm_patches():
  for model in (thesis_models.create_mnist_mtfl_2nn(), thesis_models.create_cifar10_mtfl_cnn()):
    bn = [l for l in model.layers if 'batch_normalization' in l.name]
    assert bn, model.name
    # gamma/beta trainable, moving statistics not: the (γ, β) / (μ, σ) split of ch. 4.
    assert all(len(l.trainable_weights) == 2 and len(l.non_trainable_weights) == 2 for l in bn)


def test_gru_variants_differ_only_in_width():
  small = recurrent.create_gru_char_model(79, 80, 128)
  wide = recurrent.create_gru_char_model(79, 80, 256)
  assert [l.units for l in small.layers if 'gru' in l.name] == [128, 128]
  assert [l.units for l in wide.layers if 'gru' in l.name] == [256, 256]
  # The decaying-K paper's GRU: 2 x GRU 256 between an 8-dim embedding and the output layer.
  assert wide.count_params() == 79 * 8 + 3 * (8 * 256 + 256 * 256 + 512) + \
      3 * (2 * 256 * 256 + 512) + 256 * 79 + 79


def test_resnet18_uses_group_norm_on_24x24_crops():
  model = tff_native.create_cifar100_model('resnet18')
  assert tuple(model.input_shape[1:]) == (24, 24, 3)
  names = [type(l).__name__ for l in model.layers]
  assert 'GroupNormalization' in names and 'BatchNormalization' not in names
  assert model.output_shape[-1] == 100


def test_seeded_models_are_reproducible():
  a = thesis_models.create_mnist_cnn(seed=3).get_weights()
  b = thesis_models.create_mnist_cnn(seed=3).get_weights()
  c = thesis_models.create_mnist_cnn(seed=4).get_weights()
  assert all((x == y).all() for x, y in zip(a, b))
  assert not all((x == y).all() for x, y in zip(a, c))
