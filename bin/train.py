"""Federated training of any tff_adaptive algorithm on any task.

Example:
  bin/train.py --task=digits --algorithm=fedadam --total_rounds=100 \
      --client_learning_rate=0.1 --server_learning_rate=0.01

Writes to <root_output_dir>/<experiment_name>/: flags.json, metrics.csv,
tensorboard/, checkpoints/. Rerunning the same command resumes.
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # TF's C++ start-up noise

# pylint: disable=g-import-not-at-top,unused-import
# TensorFlow must be imported before absl's app.run: imported inside main(),
# Keras 2.14 builds Sequential models from plain tensors and fails.
import tensorflow as tf
from workflow import cli
from workflow import presets
from tff_adaptive.execution import runtime

# ---- Task ----
flags.DEFINE_string('task', 'digits', 'Task name: digits | synthetic | cifar100_image | '
                    'emnist_character | emnist_autoencoder | shakespeare_character | '
                    'stackoverflow_word | stackoverflow_tag | sent140 | femnist | '
                    'shakespeare_leaf | mnist | cifar10 | gld23k (docs/tasks.md, '
                    'docs/tasks_vit.md).')
flags.DEFINE_enum('partition', 'dirichlet', ['dirichlet', 'shards', 'iid'],
                  'How a task that is split by us (digits, mnist, cifar10) divides its data '
                  'among clients.')
flags.DEFINE_integer('num_clients', 0, 'Number of clients (0: task default): of a task split by '
                     'us; for TFF tasks a seeded sample of the training clients; for LEAF tasks '
                     'the first N users.')
flags.DEFINE_float('dirichlet_alpha', 0.5, 'Dirichlet α over labels for --partition=dirichlet.')
flags.DEFINE_enum('digits_model', 'mlp', ['mlp', 'cnn', 'cnn_bn'], 'Model for --task=digits.')
flags.DEFINE_float('synthetic_alpha', 1.0, 'α of synthetic(α, β): model heterogeneity.')
flags.DEFINE_float('synthetic_beta', 1.0, 'β of synthetic(α, β): input heterogeneity.')
flags.DEFINE_string('data_dir', '', 'Where a file-based task finds its data: TFF\'s cache '
                    '(default ~/.tff), the LEAF data directory, or Keras\' datasets directory '
                    '(default ~/.keras/datasets). See docs/tasks.md.')
flags.DEFINE_integer('max_client_examples', 0, 'TFF tasks: keep only the first N examples of each '
                     'client (0: all).')
flags.DEFINE_enum('cifar100_image_model', 'resnet18', ['resnet18', 'fedgbo_cnn', 'vit_s16'],
                  'Model for --task=cifar100_image.')
flags.DEFINE_enum('emnist_character_model', 'cnn_dropout',
                  ['cnn_dropout', 'cnn', '2nn', 'fedgbo_cnn'], 'Model for --task=emnist_character.')
flags.DEFINE_enum('shakespeare_character_model', 'lstm', ['lstm', 'gru128', 'gru256'],
                  'Model for --task=shakespeare_character.')
flags.DEFINE_enum('femnist_model', 'cnn', ['cnn', 'dnn'], 'Model for --task=femnist.')
flags.DEFINE_enum('shakespeare_leaf_model', 'gru128', ['gru128', 'gru256'],
                  'Model for --task=shakespeare_leaf.')
flags.DEFINE_enum('mnist_model', '2nn', ['2nn', 'cnn', 'mtfl_2nn'], 'Model for --task=mnist.')
flags.DEFINE_enum('cifar10_model', 'cnn', ['cnn', 'mtfl_cnn', 'resnet18'],
                  'Model for --task=cifar10 (resnet18: ResNet-18-GroupNorm, seed 003; '
                  '--partition=dirichlet only).')
# ViT-S/16 fine-tuning (seed 002): gld23k, cifar100_image --cifar100_image_model=vit_s16.
flags.DEFINE_enum('finetune', 'head', ['head', 'full'], 'ViT: train only the new linear head, or '
                  'every weight after the head is replaced.')
flags.DEFINE_string('pretrained_weights', '', 'ViT: local .npz of pretrained weights in Google\'s '
                    'ViT checkpoint layout (no hub is used).')
flags.DEFINE_bool('allow_random_init', False, 'ViT: without --pretrained_weights, start from '
                  'random weights (with a warning: seed 002\'s numbers need pretrained ones).')

# ---- Client ----
flags.DEFINE_integer('clients_per_round', 10, 'Clients sampled per round.')
flags.DEFINE_integer('client_batch_size', 10, 'Client minibatch size B.')
flags.DEFINE_integer('client_epochs_per_round', 1, 'Local epochs E (ignored with --local_steps).')
flags.DEFINE_integer('local_steps', 0, 'Exactly K local minibatch steps (cycling the data); '
                     '0 means use --client_epochs_per_round.')
flags.DEFINE_string('client_optimizer', 'sgd', 'Client optimiser (which ones depends on --algorithm).')
flags.DEFINE_float('client_learning_rate', 0.1, 'Client learning rate η.')
flags.DEFINE_float('client_beta_1', 0.9, 'Client optimiser β (SGDm, RMSProp) or β1 (Adam).')
flags.DEFINE_float('client_beta_2', 0.99, 'Client optimiser β2 (Adam).')
flags.DEFINE_float('client_epsilon', 1e-8, 'Client optimiser ε (> 0).')
flags.DEFINE_enum('client_weighting', 'default', ['default', 'num_examples', 'uniform'],
                  'Aggregation weights; default: the algorithm paper\'s choice.')

# ---- Server ----
flags.DEFINE_string('algorithm', 'fedavg', 'Algorithm: fedavg | fedavgm | fedadagrad | fedadam | '
                    'fedyogi | fedgbo | mfl | mimelite | mimexlite | fedprox | fedmax | fedada2 | ce_fedavg '
                    '| mtfl | perfedavg | pfedme.')
flags.DEFINE_string('server_optimizer', '', 'Server optimiser; empty: the algorithm\'s own.')
flags.DEFINE_float('server_learning_rate', 1.0, 'Server learning rate η_s.')
flags.DEFINE_enum('server_optimizer_semantics', 'tff', ['tff', 'paper'],
                  'tff: TFF\'s optimisers as shipped; paper: FedOpt Algorithm 2 exactly.')
flags.DEFINE_float('server_beta_1', 0.9, 'Server β1 (momentum).')
flags.DEFINE_float('server_beta_2', 0.99, 'Server β2.')
flags.DEFINE_float('server_epsilon', 1e-3, 'Server adaptivity τ.')

# ---- Algorithm-specific ----
flags.DEFINE_enum('fedgbo_upload', 'model', ['model', 'average_gradient'],
                  'FedGBO: upload the model (tracking by inverse step) or the mean gradient.')
flags.DEFINE_bool('mfl_bias_correction', False, 'MFL-Adam: Adam bias correction on clients.')
flags.DEFINE_float('fedprox_mu', 0.01, 'FedProx proximal strength μ.')
flags.DEFINE_float('fedmax_beta', 1.0, 'FedMAX max-entropy weight β.')
flags.DEFINE_enum('preconditioner', 'none', ['none', 'dja'], 'FedAda2: dja = the server '
                  'broadcasts its second moment and clients start from it; none = zero start.')
flags.DEFINE_bool('client_lr_warmup', False, 'FedAda2: warm the client lr up over the first '
                  '10 local steps of each round.')
flags.DEFINE_enum('sm3_variant', 'II', ['I', 'II'], 'SM3-AdaGrad variant.')
flags.DEFINE_integer('sm3_delay', 1, 'SM3: refresh the preconditioner every z local steps.')
flags.DEFINE_bool('client_bias_correction', False, 'FedAda2 client Adam/SM3-Adam bias correction.')

# ---- Upload compression (SPEC §6) ----
flags.DEFINE_enum('upload_compression', 'none', ['none', 'topk', 'topk_uniq'],
                  'Compress client uploads: top-(1-s) sparsification with Golomb-coded indices '
                  '(optimiser-state uploads share the weights\' indices); topk_uniq adds 8-bit '
                  'UniQ/ExpQ values.')
flags.DEFINE_float('sparsity', 0.9, 'Fraction s of each weight tensor dropped, in [0, 1).')

# ---- Differential privacy (any algorithm; implies uniform weighting) ----
flags.DEFINE_bool('dp', False, 'Clip each client update and add Gaussian noise (TFF DP aggregator).')
flags.DEFINE_float('dp_clip_norm', None, 'DP: L2 clip norm C of each client update.')
flags.DEFINE_float('dp_noise_multiplier', None, 'DP: noise std σ as a multiple of C.')
flags.DEFINE_float('dp_delta', 0.0, 'DP: δ for the reported ε (0: 1 / number of clients).')

# ---- Schedules (SPEC §1, §5) and the runtime model ----
flags.DEFINE_enum('local_steps_schedule', 'constant',
                  ['constant', 'exp', 'rounds', 'error', 'step', 'theory'],
                  'K_t schedule; --local_steps is K_0.')
flags.DEFINE_float('local_steps_decay', None, 'exp: K_t = ceil(K_0 d^t), d in (0, 1].')
flags.DEFINE_float('local_steps_theory_b', None, 'theory: K_t = max(K_0/(b+t), 1).')
flags.DEFINE_integer('schedule_window', None, 'error schedules: rolling window s (default 100).')
flags.DEFINE_integer('plateau_patience', None, 'step schedules: evaluations without '
                     'improvement before dividing by 10 (default 10).')
flags.DEFINE_float('plateau_min_delta', None, 'step schedules: smallest improvement (1e-4).')
for _prefix in ('client', 'server'):
  flags.DEFINE_enum(f'{_prefix}_lr_schedule', 'constant',
                    ['constant', 'exp_decay', 'inv_lin_decay', 'inv_sqrt_decay', 'exp', 'rounds',
                     'error', 'step'], f'{_prefix} learning-rate schedule.')
  flags.DEFINE_float(f'{_prefix}_lr_decay_rate', None, f'{_prefix} lr decay rate.')
  flags.DEFINE_integer(f'{_prefix}_lr_decay_steps', None, f'{_prefix} lr decay steps (rounds).')
  flags.DEFINE_bool(f'{_prefix}_lr_staircase', None, f'{_prefix} lr: staircase decay.')
  flags.DEFINE_integer(f'{_prefix}_lr_warmup_rounds', None, f'{_prefix} lr linear warm-up rounds.')
flags.DEFINE_float('step_time_seconds', 0.0, 'Runtime model: compute seconds per minibatch β.')
flags.DEFINE_bool('measure_step_time', False, 'Runtime model: measure β on this machine.')
flags.DEFINE_float('download_mbps', 20.0, 'Runtime model: client download bandwidth D.')
flags.DEFINE_float('upload_mbps', 5.0, 'Runtime model: client upload bandwidth U.')

# ---- Personalised FL (thesis ch. 4, SPEC §7; docs/mtfl.md) ----
flags.DEFINE_enum('private', 'all', ['all', 'mu_sigma', 'gamma_beta', 'none'],
                  'MTFL: batch-norm values each client keeps private (its patch): all = '
                  '(μ, σ, γ, β); none = plain FL.')
flags.DEFINE_enum('mtfl_strategy', 'fedavg', ['fedavg', 'fedadam', 'fedavg_adam'],
                  'MTFL optimisation strategy: fedavg (SGD clients, average), fedadam (server '
                  'Adam), fedavg_adam (Adam clients, averaged moments; private moments of '
                  'private γ, β).')
flags.DEFINE_float('perfedavg_beta', 0.001, 'Per-FedAvg meta step size β (α is '
                   '--client_learning_rate).')
flags.DEFINE_float('pfedme_lambda', 15.0, 'pFedMe regularisation λ.')
flags.DEFINE_float('pfedme_personal_learning_rate', 0.01, 'pFedMe inner (personal) step η_p.')
flags.DEFINE_integer('pfedme_inner_steps', 1, 'pFedMe inner steps per local step (the thesis: 1).')
flags.DEFINE_float('pfedme_beta', 1.0, 'pFedMe server mixing β.')
flags.DEFINE_float('noisy_client_fraction', 0.0, 'Personalised algorithms: this fraction of '
                   'clients gets fixed Gaussian noise on its training inputs; user accuracy is '
                   'averaged over the other clients.')
flags.DEFINE_float('noise_stddev', 0.2, 'Standard deviation of the noisy clients\' input noise.')
flags.DEFINE_string('client_state_dir', '', 'Where personalised algorithms keep each client\'s '
                    'private state (default <experiment dir>/client_state).')

# ---- Diagnostics ----
flags.DEFINE_bool('measure_client_drift', False, 'Report client_drift/{delta,model}_cosine_'
                  'distance each round: mean pairwise cosine distance between the sampled '
                  'clients\' updates Δ_i (delta) or final weights (model), seed 000 Fig. 6.1. '
                  'Costs two extra float64 sums of model size per client per round (simulation '
                  'only, not counted in cost/ bits). Round-composer algorithms only (not '
                  'mimelite, fedprox, mtfl, perfedavg, pfedme).')

# ---- Paper presets (workflow/presets.py) ----
flags.DEFINE_string('preset', '', 'Set a paper\'s published settings, <paper>:<task> (e.g. '
                    'fedgbo:femnist, fedopt:emnist_character, decayk:femnist; the list is in '
                    'workflow/presets.py). Flags given on the command line win; --data_dir '
                    'is never set by a preset.')

# ---- Training loop ----
flags.DEFINE_integer('total_rounds', 100, 'Total rounds (may be raised when resuming).')
flags.DEFINE_integer('rounds_per_eval', 5, 'Evaluate every this many rounds.')
flags.DEFINE_integer('rounds_per_checkpoint', 10, 'Checkpoint every this many rounds.')
flags.DEFINE_string('root_output_dir', 'runs', 'Root directory for experiment outputs.')
flags.DEFINE_string('experiment_name', '', 'Experiment directory name (default: <task>_<algorithm>).')
flags.DEFINE_integer('seed', 0, 'Seed for data splits, client sampling and shuffling.')
flags.DEFINE_integer('execution_concurrency', 0, 'Max concurrent client computations in '
                     'TFF\'s C++ runtime. 0: two per CPU core (the fastest measured, '
                     'docs/performance.md); -1: unlimited (TFF\'s default).')
flags.DEFINE_bool('show_progress', True, 'Show a progress bar.')

# ---- Workers (docs/workers.md) ----
flags.DEFINE_string('workers', '', 'Comma-separated host:port of TFF workers started with '
                    'bin/worker.py; each round\'s clients are split across them. Empty: run '
                    'locally. --execution_concurrency does not apply (pass '
                    '--max_concurrent_computation_calls to each worker).')
flags.DEFINE_bool('worker_retry', False, 'When a worker is lost mid-round, re-run the round on '
                  'the remaining workers instead of failing.')
flags.DEFINE_bool('data_on_workers', False, 'Workers build client datasets from client ids '
                  '(the task\'s serializable dataset function) instead of receiving them; '
                  'file-based tasks need their data at the same --data_dir on every worker.')

FLAGS = flags.FLAGS


def main(argv):
  # First: from here on TFF's workers are tracked and its exit-time
  # ServiceManager noise is disarmed, whichever way this program ends.
  runtime.track_tff_workers()
  if len(argv) > 1:
    cli.fail(f'unexpected arguments: {" ".join(argv[1:])}')
  if FLAGS.preset:
    try:
      applied = presets.apply(FLAGS.preset, FLAGS)
    except presets.UnknownPresetError as e:
      cli.fail(str(e))
    print(f'--preset={FLAGS.preset} sets {" ".join(applied) or "nothing (all given)"}',
          file=sys.stderr, flush=True)
  cfg = FLAGS.flag_values_dict()
  cfg = {k: cfg[k] for k in cli.TRAIN_FLAG_NAMES if k in cfg}
  cli.run_training(cfg)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags_or_exit)
