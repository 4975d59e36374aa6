"""Paper presets: `bin/train --preset=<paper>:<task>` sets a paper's published settings.

Each preset is the exact flag set of one row of docs/tasks.md (the papers'
model, batch size B, local steps K or epochs E, clients per round, client
population, rounds and, where the paper states it, the learning rate), so a
user with the real data runs the paper's experiment with

  bin/train.py --preset=fedgbo:femnist --data_dir=leaf/data/femnist/data

`--data_dir` is never part of a preset (where the data lives is the user's).
Flags given on the command line win over the preset: swap `--algorithm` (and
its hyperparameters) for the method being compared, as the papers do.
tests/test_presets.py checks that every preset is a command of docs/tasks.md
and runs on the task's fixture.

Papers: fedopt = the FedOpt paper (Reddi et al., Adaptive Federated Optimization);
fedgbo = the FedGBO paper; decayk = the decaying-K paper (decaying number of local SGD steps);
thesis3 / thesis4 / thesis5 = the thesis' chapters 3 (CE-FedAvg), 4 (MTFL) and
5 (decaying K).
"""

from collections.abc import Mapping

PRESETS: Mapping[str, Mapping[str, str]] = {
    # the FedOpt paper, Appendix D: B, E = 1, clients per round, rounds.
    'fedopt:cifar100': dict(task='cifar100_image', cifar100_image_model='resnet18',
                            client_batch_size='20', client_epochs_per_round='1',
                            clients_per_round='10', total_rounds='4000', algorithm='fedadam'),
    'fedopt:emnist_character': dict(task='emnist_character',
                                    emnist_character_model='cnn_dropout',
                                    client_batch_size='20', client_epochs_per_round='1',
                                    clients_per_round='10', total_rounds='1500',
                                    algorithm='fedadam'),
    'fedopt:emnist_autoencoder': dict(task='emnist_autoencoder', client_batch_size='20',
                                      client_epochs_per_round='1', clients_per_round='10',
                                      total_rounds='3000', algorithm='fedyogi'),
    'fedopt:shakespeare': dict(task='shakespeare_character', shakespeare_character_model='lstm',
                               client_batch_size='4', client_epochs_per_round='1',
                               clients_per_round='10', total_rounds='1200', algorithm='fedadam'),
    'fedopt:stackoverflow_word': dict(task='stackoverflow_word', client_batch_size='16',
                                      client_epochs_per_round='1', clients_per_round='50',
                                      total_rounds='1500', algorithm='fedadam'),
    'fedopt:stackoverflow_tag': dict(task='stackoverflow_tag', client_batch_size='100',
                                     client_epochs_per_round='1', clients_per_round='10',
                                     total_rounds='1500', algorithm='fedadagrad'),
    # the FedGBO paper: K = 10, evaluation every 50 rounds, 5000 rounds.
    'fedgbo:cifar100': dict(task='cifar100_image', cifar100_image_model='fedgbo_cnn',
                            client_batch_size='32', local_steps='10', clients_per_round='5',
                            total_rounds='5000', rounds_per_eval='50', algorithm='fedavg',
                            client_learning_rate='0.01'),
    'fedgbo:sent140': dict(task='sent140', client_batch_size='8', local_steps='10',
                           clients_per_round='22', total_rounds='5000', rounds_per_eval='50',
                           algorithm='fedavg'),
    'fedgbo:femnist': dict(task='femnist', femnist_model='cnn', num_clients='3000',
                           client_batch_size='32', local_steps='10', clients_per_round='30',
                           total_rounds='5000', rounds_per_eval='50', algorithm='fedavg'),
    'fedgbo:shakespeare': dict(task='shakespeare_leaf', shakespeare_leaf_model='gru128',
                               client_batch_size='32', local_steps='10', clients_per_round='7',
                               total_rounds='5000', rounds_per_eval='50', algorithm='fedavg'),
    # the decaying-K paper: 4000 rounds, 10 clients per round, K_0 = 10 (K ∈ {3, 10, 33, 100} in the paper).
    'decayk:stackoverflow_tag': dict(task='stackoverflow_tag', num_clients='1000',
                                     max_client_examples='250', client_batch_size='32',
                                     local_steps='10', clients_per_round='10',
                                     client_learning_rate='1.0', algorithm='fedadam',
                                     server_learning_rate='0.3', server_beta_1='0.9',
                                     server_beta_2='0.999', server_epsilon='1e-8',
                                     total_rounds='4000'),
    'decayk:femnist': dict(task='femnist', femnist_model='cnn', num_clients='1000',
                           client_batch_size='32', local_steps='10', clients_per_round='10',
                           client_learning_rate='0.3', total_rounds='4000', algorithm='fedavg'),
    'decayk:shakespeare': dict(task='shakespeare_leaf', shakespeare_leaf_model='gru256',
                               client_batch_size='32', local_steps='10', clients_per_round='10',
                               client_learning_rate='1.0', total_rounds='4000',
                               algorithm='fedavg'),
    # thesis ch. 3: W = 10, C = 0.5, E = 1, B = 20, 2 label shards per client.
    'thesis3:mnist': dict(task='mnist', mnist_model='2nn', partition='shards', num_clients='10',
                          clients_per_round='5', client_batch_size='20',
                          client_epochs_per_round='1', algorithm='fedavg'),
    'thesis3:cifar10': dict(task='cifar10', cifar10_model='cnn', partition='shards',
                            num_clients='10', clients_per_round='5', client_batch_size='20',
                            client_epochs_per_round='1', algorithm='fedavg'),
    # thesis ch. 4: W = 200, C = 0.5, 500 rounds, BN patch models.
    'thesis4:mnist': dict(task='mnist', mnist_model='mtfl_2nn', partition='shards',
                          num_clients='200', clients_per_round='100', client_batch_size='20',
                          client_epochs_per_round='1', total_rounds='500', algorithm='fedavg'),
    'thesis4:cifar10': dict(task='cifar10', cifar10_model='mtfl_cnn', partition='shards',
                            num_clients='200', clients_per_round='100', client_batch_size='20',
                            client_epochs_per_round='1', total_rounds='500', algorithm='fedavg'),
    # thesis ch. 5: the K_0 and learning rates of Table 5.1, 10000 rounds.
    'thesis5:cifar100': dict(task='cifar100_image', cifar100_image_model='fedgbo_cnn',
                             client_batch_size='32', local_steps='50', clients_per_round='25',
                             client_learning_rate='0.01', total_rounds='10000',
                             algorithm='fedavg'),
    'thesis5:sent140': dict(task='sent140', client_batch_size='8', local_steps='60',
                            clients_per_round='50', client_learning_rate='3.0',
                            total_rounds='10000', algorithm='fedavg'),
    'thesis5:femnist': dict(task='femnist', femnist_model='dnn', num_clients='3000',
                            client_batch_size='32', local_steps='80', clients_per_round='60',
                            client_learning_rate='0.3', total_rounds='10000', algorithm='fedavg'),
    'thesis5:shakespeare': dict(task='shakespeare_leaf', shakespeare_leaf_model='gru128',
                                client_batch_size='32', local_steps='80', clients_per_round='10',
                                client_learning_rate='0.1', total_rounds='10000',
                                algorithm='fedavg'),
}


class UnknownPresetError(ValueError):
  pass


def preset_flags(name: str) -> Mapping[str, str]:
  """The flags of preset `name` ('<paper>:<task>')."""
  if name not in PRESETS:
    raise UnknownPresetError(f'--preset must be one of {", ".join(sorted(PRESETS))}; got {name!r}')
  return PRESETS[name]


def apply(name: str, flag_values) -> list[str]:
  """Sets preset `name` on absl `flag_values` where the command line did not.

  Returns the flags the preset set, as `--flag=value` strings (for the log).
  """
  applied = []
  for flag, value in preset_flags(name).items():
    if flag_values[flag].present:
      continue  # given on the command line: it wins
    flag_values[flag].value = flag_values[flag].parser.parse(value)
    applied.append(f'--{flag}={value}')
  return applied
