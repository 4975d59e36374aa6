"""bin/train's flags, in groups: one entry per flag, the only place a flag is declared.

One table (`GROUPS`) defines every flag of bin/train: its name, kind, default,
help, group, readers, checks and the library arguments it sets (`Flag`).
Everything else about flags is derived from it: the typed settings
(`workflow.flags.config`, a field per flag), the value checks
(`workflow.flags.validation`), library errors told in flag words
(`workflow.flags.library_flags`, through `ARGUMENT_FLAGS`), --help and flags.json.
Adding a flag is its entry here plus the code that uses its value (e.g. the
builder in workflow/training/algorithm_builders.py that passes it to the library).

`define_flags()` turns the table into absl flags whose "module" is the group,
so `bin/train.py --helpfull` lists them group by group;
`train_help.grouped_help()` is bin/train's `--help`: the groups in order, each
flag with its allowed values, its algorithm-specific defaults and the
algorithms that read it. Nothing is defined at import.

Group order follows google-research/federated's `optimization/trainer.py`:
task, client, server, algorithm-specific, aggregation (compression, DP, TFF
aggregators), schedules and the runtime model, personalised FL, diagnostics,
paper presets, the training loop, workers.
"""

import dataclasses
from typing import Any, Optional, Union

from absl import flags

from tasks import settings as task_settings
from tff_adaptive.algorithms import names as library_names
from workflow.flags import flag_checks
from workflow.flags import schedule_flags


@dataclasses.dataclass(frozen=True)
class Having:
  """The readers of a flag: the algorithms whose registry entry has `feature`.

  `feature` is a key of `workflow.flags.algorithms.FEATURES`, resolved into names by
  --help (`readers`); absl's --helpfull, defined without importing the
  registry (which imports TFF: bin/sweep defines these flags to parse values),
  says `who` instead.
  """
  feature: str
  who: str


_CLIENT_OPT = Having('client_optimizer', 'the algorithms with a choice of client optimiser')
_SERVER_OPT = Having('server_optimizer', 'the algorithms with a server optimiser')
_AGGREGATED = Having('aggregator', 'the algorithms that take --aggregator and --dp')
_COMPRESSIBLE = Having('compressible', 'the algorithms whose uploads can be compressed')
_DRIFT = Having('measures_client_drift', 'the algorithms of the round composer')
PERSONALIZED = Having('personalized', 'the personalised algorithms')

TASK_MODEL_FLAGS = ('digits_model', 'cifar100_image_model', 'emnist_character_model',
                    'shakespeare_character_model', 'femnist_model', 'shakespeare_leaf_model',
                    'mnist_model', 'cifar10_model')


@dataclasses.dataclass(frozen=True)
class Flag:
  """One bin/train flag: everything about it that is not the code that uses its value.

  Attributes:
    name: the flag name (without --); also its field in `workflow.flags.config.Settings`.
    kind: 'string' | 'enum' | 'integer' | 'float' | 'bool'.
    default: the default (before any algorithm default).
    help: one-paragraph description.
    values: an enum's allowed values.
    algorithms: the algorithms that read the flag (names, or `Having` a
      feature of their registry entries); empty: every algorithm.
    checks: what a value must be (`workflow.flags.flag_checks`), checked in order by
      `workflow.flags.validation` before anything is built.
    feeds: the library arguments the flag sets, as (owner, argument) of the
      `tff_adaptive.errors.ArgumentError` that refuses them; owner None: that
      argument of any owner; argument None: the owner's refusal as a whole.
      A refusal of one of them is told in the flag's words
      (`workflow.flags.library_flags`).
    in_state: where a population's member keeps its value, as (state part, the
      keys it may have there), for the flags in which the members of one
      population may differ (bin/train --together); empty: members share it.
  """
  name: str
  kind: str
  default: Any
  help: str
  values: tuple[str, ...] = ()
  algorithms: Union[tuple[str, ...], Having] = ()
  checks: tuple[flag_checks.Check, ...] = ()
  feeds: tuple[tuple[Optional[str], Optional[str]], ...] = ()
  in_state: tuple[str, tuple[str, ...]] = ()


def _flag(name, kind, default, help_, values=(), algorithms=(), check=(), feeds=(),
          in_state=()) -> Flag:
  checks = (check,) if isinstance(check, flag_checks.Check) else tuple(check)
  return Flag(name, kind, default, help_, tuple(values), algorithms, checks, feeds, in_state)


def _s(name, default, help_, algorithms=(), **more):
  return _flag(name, 'string', default, help_, algorithms=algorithms, **more)


def _e(name, default, values, help_, algorithms=(), **more):
  return _flag(name, 'enum', default, help_, values, algorithms, **more)


def _i(name, default, help_, algorithms=(), **more):
  return _flag(name, 'integer', default, help_, algorithms=algorithms, **more)


def _f(name, default, help_, algorithms=(), **more):
  return _flag(name, 'float', default, help_, algorithms=algorithms, **more)


def _b(name, default, help_, algorithms=(), **more):
  return _flag(name, 'bool', default, help_, algorithms=algorithms, **more)


def _t(make, name, *rest, **more):
  # A task flag: its default is tasks.settings' (TaskSettings), the one place it is set.
  return make(name, task_settings.DEFAULTS[name], *rest, **more)


def lr_schedule_flags(prefix: str) -> list[Flag]:
  return [
      _e(f'{prefix}_lr_schedule', 'constant', schedule_flags.LR_SCHEDULES,
         f'{prefix} learning-rate schedule (docs/schedules.md).',
         feeds=(('RoundSchedules', f'{prefix}_lr'),)),
      _f(f'{prefix}_lr_decay_rate', None, f'{prefix} lr decay rate.', check=flag_checks.POSITIVE),
      _i(f'{prefix}_lr_decay_steps', None, f'{prefix} lr decay steps (rounds).',
         check=flag_checks.POSITIVE_INT),
      _flag(f'{prefix}_lr_staircase', 'bool', None, f'{prefix} lr: staircase decay.'),
      _i(f'{prefix}_lr_warmup_rounds', None, f'{prefix} lr linear warm-up rounds.',
         check=flag_checks.NON_NEGATIVE_INT),
  ]


# (group key, title, flags). The key is the absl "module" of the group's flags.
GROUPS: list[tuple[str, str, list[Flag]]] = [
    ('task', 'Task: the data, how it is split among clients, the model', [
        _t(_s, 'task', 'A registered task (docs/tasks.md, docs/tasks_vit.md), or '
           '`package.module:function` returning your own tasks.base.FederatedTask '
           '(docs/tasks.md#your-own-task).'),
        _t(_e, 'partition', ('dirichlet', 'shards', 'iid'),
           'How a task that is split by us (digits, mnist, cifar10) divides its data among '
           'clients.'),
        _t(_i, 'num_clients', 'Number of clients (0: task default): of a task split by us; for '
           'TFF tasks a seeded sample of the training clients; for LEAF tasks the first N users.',
           check=flag_checks.NON_NEGATIVE_INT),
        _t(_f, 'dirichlet_alpha', 'Dirichlet α over labels for --partition=dirichlet.',
           check=(flag_checks.POSITIVE, flag_checks.DIRICHLET_ALPHA)),
        _t(_e, 'digits_model', ('mlp', 'cnn', 'cnn_bn'), 'Model for --task=digits.'),
        _t(_f, 'synthetic_alpha', 'α of synthetic(α, β): model heterogeneity.',
           check=flag_checks.NON_NEGATIVE),
        _t(_f, 'synthetic_beta', 'β of synthetic(α, β): input heterogeneity.',
           check=flag_checks.NON_NEGATIVE),
        _t(_s, 'data_dir', 'Where a file-based task finds its data: TFF\'s cache (default '
           '~/.tff), the LEAF data directory, or Keras\' datasets directory (default '
           '~/.keras/datasets). See docs/tasks.md.'),
        _t(_i, 'max_client_examples', 'TFF tasks: keep only the first N examples of each client '
           '(0: all).', check=flag_checks.NON_NEGATIVE_INT),
        _t(_e, 'cifar100_image_model', ('resnet18', 'fedgbo_cnn', 'vit_s16'),
           'Model for --task=cifar100_image.'),
        _t(_e, 'emnist_character_model', ('cnn_dropout', 'cnn', '2nn', 'fedgbo_cnn'),
           'Model for --task=emnist_character.'),
        _t(_e, 'shakespeare_character_model', ('lstm', 'gru128', 'gru256'),
           'Model for --task=shakespeare_character.'),
        _t(_e, 'femnist_model', ('cnn', 'dnn'), 'Model for --task=femnist.'),
        _t(_e, 'shakespeare_leaf_model', ('gru128', 'gru256'),
           'Model for --task=shakespeare_leaf.'),
        _t(_e, 'mnist_model', ('2nn', 'cnn', 'mtfl_2nn'), 'Model for --task=mnist.'),
        _t(_e, 'cifar10_model', ('cnn', 'mtfl_cnn', 'resnet18'),
           'Model for --task=cifar10 (resnet18: ResNet-18-GroupNorm, FedOpt paper; '
           '--partition=dirichlet only).'),
        _t(_e, 'finetune', ('head', 'full'), 'ViT (gld23k, cifar100_image with vit_s16): '
           'train only the new linear head, or every weight after the head is replaced.'),
        _t(_s, 'pretrained_weights', 'ViT: local .npz of pretrained weights in Google\'s ViT '
           'checkpoint layout (no hub is used).'),
        _t(_b, 'allow_random_init', 'ViT: without --pretrained_weights, start from random '
           'weights (with a warning: the FedAda2 paper\'s numbers need pretrained ones).'),
    ]),
    ('client', 'Client: sampling, local work, client optimiser', [
        _i('clients_per_round', 10, 'Clients sampled per round.', check=flag_checks.POSITIVE_INT),
        _i('client_batch_size', 10, 'Client minibatch size B.', check=flag_checks.POSITIVE_INT),
        _i('client_epochs_per_round', 1, 'Local epochs E (ignored with --local_steps).',
           check=flag_checks.POSITIVE_INT),
        _i('local_steps', 0, 'Exactly K local minibatch steps (cycling the data); 0 means use '
           '--client_epochs_per_round.',
           check=(flag_checks.NON_NEGATIVE_INT, flag_checks.LOCAL_STEPS),
           feeds=((None, 'local_steps'),)),
        _s('client_optimizer', 'sgd', 'Client optimiser; the allowed ones depend on '
           '--algorithm (listed below).', _CLIENT_OPT,
           feeds=(('BiasedOptimizer', 'name'), ('fedada2.build_client_optimizer', 'name'))),
        _f('client_learning_rate', 0.1, 'Client learning rate η.', check=flag_checks.POSITIVE,
           in_state=('client_work', ('learning_rate',))),
        _f('client_beta_1', 0.9, 'Client optimiser β (SGDm, RMSProp) or β1 (Adam). SGDm is '
           'the FedGBO paper\'s m ← βm + (1−β)g for fedgbo and mfl (docs/algorithms.md) and TFF\'s heavy '
           'ball m ← βm + g for the others (e.g. mimelite): TFF\'s rate η(1−β) gives seed '
           '000\'s iterates at η.', _CLIENT_OPT, check=flag_checks.UNIT_INTERVAL,
           feeds=(('BiasedOptimizer', 'beta_1'),)),
        _f('client_beta_2', 0.99, 'Client optimiser β2 (Adam).', _CLIENT_OPT,
           check=flag_checks.UNIT_INTERVAL, feeds=(('BiasedOptimizer', 'beta_2'),)),
        _f('client_epsilon', 1e-8, 'Client optimiser ε (> 0).', _CLIENT_OPT,
           check=flag_checks.POSITIVE, feeds=(('BiasedOptimizer', 'epsilon'),)),
        _e('client_weighting', 'default', ('default', 'num_examples', 'uniform'),
           'Aggregation weights; default: the algorithm paper\'s choice.'),
    ]),
    ('server', 'Server: algorithm and server optimiser', [
        _s('algorithm', 'fedavg', 'The algorithm (README table); each runs with only this flag '
           'given, using its paper\'s defaults (printed at start).'),
        _s('server_optimizer', '', 'Server optimiser: '
           f'{" | ".join(library_names.FEDOPT_SERVER_OPTIMIZERS)}; empty: '
           'the algorithm\'s own (FedOpt names fix it).', _SERVER_OPT,
           feeds=(('fedopt.build_server_optimizer', 'name'),
                  ('fedada2.build_server_optimizer', 'name'))),
        _f('server_learning_rate', 1.0, 'Server learning rate η_s.', _SERVER_OPT,
           check=flag_checks.POSITIVE, in_state=('finalizer', ('learning_rate',))),
        _e('server_optimizer_semantics', 'tff', ('tff', 'paper'),
           'tff: TFF\'s optimisers as shipped; paper: FedOpt Algorithm 2 exactly.',
           Having('server_optimizer_semantics', 'the algorithms with a FedOpt server '
                  'optimiser'), feeds=(('fedopt.build_server_optimizer', 'semantics'),)),
        # TFF's optimisers keep β₁ as `momentum` in SGDm.
        _f('server_beta_1', 0.9, 'Server β1 (momentum).', _SERVER_OPT,
           check=flag_checks.UNIT_INTERVAL, in_state=('finalizer', ('beta_1', 'momentum'))),
        _f('server_beta_2', 0.99, 'Server β2.', _SERVER_OPT, check=flag_checks.UNIT_INTERVAL,
           in_state=('finalizer', ('beta_2',))),
        _f('server_epsilon', 1e-3, 'Server adaptivity τ.', _SERVER_OPT,
           check=flag_checks.POSITIVE, in_state=('finalizer', ('epsilon',))),
    ]),
    ('algorithm', 'Algorithm-specific', [
        _e('fedgbo_upload', 'model', ('model', 'average_gradient'),
           'FedGBO: upload the model (tracking by inverse step) or the mean gradient.',
           ('fedgbo',), feeds=(('fedgbo', 'upload'),)),
        _b('mfl_bias_correction', False, 'Adam bias correction on clients (MFL-Adam, FedGBO, '
           'MTFL fedavg_adam).', ('fedgbo', 'mfl', 'mtfl')),
        _e('mime_statistics', 'tff', ('tff', 'paper'), 'Mime Lite / MimeXlite base optimiser '
           'RMSProp or Adam: tff = TFF\'s (v from 0, Adam bias-corrected); paper = the FedGBO '
           'paper\'s (v from 1, no correction).', ('mimelite', 'mimexlite')),
        _f('fedprox_mu', 0.01, 'FedProx proximal strength μ.', ('fedprox',),
           check=flag_checks.NON_NEGATIVE, feeds=(('fedprox', 'proximal_strength'),),
           in_state=('client_work', ('proximal_strength',))),
        _f('feddyn_alpha', 0.01, 'FedDyn dynamic regulariser α (the middle of the paper\'s '
           'grid 0.1, 0.01, 0.001).', ('feddyn',), check=flag_checks.POSITIVE,
           feeds=(('feddyn', 'alpha'),)),
        _f('fedmax_beta', 1.0, 'FedMAX max-entropy weight β.', ('fedmax',),
           check=flag_checks.NON_NEGATIVE, feeds=(('fedmax', 'beta'),)),
        _e('preconditioner', 'none', ('none', 'dja'), 'FedAda2: dja = the server broadcasts its '
           'second moment and clients start from it; none = zero start.', ('fedada2',),
           feeds=(('fedada2', 'preconditioner'),)),
        _b('client_lr_warmup', False, 'FedAda2: warm the client lr up over the first 10 local '
           'steps of each round.', ('fedada2',)),
        _e('sm3_variant', 'II', ('I', 'II'), 'SM3-AdaGrad variant.', ('fedada2',)),
        _i('sm3_delay', 1, 'SM3: refresh the preconditioner every z local steps.', ('fedada2',),
           check=flag_checks.POSITIVE_INT, feeds=(('fedada2.build_client_optimizer', 'delay'),)),
        _b('client_bias_correction', False, 'FedAda2 client Adam/SM3-Adam bias correction.',
           ('fedada2',)),
    ]),
    ('aggregation', 'Aggregation: TFF aggregators, upload compression, differential privacy', [
        _e('aggregator', 'mean', ('mean', 'robust', 'secure'),
           'How client updates are aggregated: mean (the builder\'s own), robust '
           '(tff.learning.robust_aggregator: zeroing and adaptive clipping), secure '
           '(tff.learning.secure_aggregator; simulated with TFF\'s test execution context, '
           'which bin/train sets).', _AGGREGATED),
        _b('aggregator_zeroing', True, '--aggregator=robust|secure: zero out updates with '
           'outlying norms.', _AGGREGATED),
        _b('aggregator_clipping', True, '--aggregator=robust|secure: adaptive L2 clipping of '
           'updates.', _AGGREGATED),
        _e('upload_compression', 'none', ('none', 'topk', 'topk_uniq'),
           'Compress client uploads: top-(1-s) sparsification with Golomb-coded indices '
           '(optimiser-state uploads share the weights\' indices); topk_uniq adds 8-bit '
           'UniQ/ExpQ values.', _COMPRESSIBLE),
        _f('sparsity', 0.9, 'Fraction s of each weight tensor dropped, in [0, 1).',
           _COMPRESSIBLE, check=flag_checks.UNIT_INTERVAL,
           feeds=(('SharedIndexCompressionFactory', 'sparsity'),)),
        _b('dp', False, 'Clip each client update and add Gaussian noise (TFF DP aggregator; '
           'implies uniform weighting).', _AGGREGATED),
        _f('dp_clip_norm', None, 'DP: L2 clip norm C of each client update.', _AGGREGATED,
           feeds=(('dp_aggregator', 'clip_norm'),)),
        _f('dp_noise_multiplier', None, 'DP: noise std σ as a multiple of C.', _AGGREGATED,
           check=flag_checks.DP_NOISE_MULTIPLIER, feeds=(('dp_aggregator', 'noise_multiplier'),)),
        _f('dp_delta', 0.0, 'DP: δ for the reported ε (0: 1 / number of clients).', _AGGREGATED,
           check=flag_checks.DP_DELTA),
    ]),
    ('schedules', 'Schedules of K, η, η_s and the runtime model (docs/schedules.md)', [
        _e('local_steps_schedule', 'constant', schedule_flags.LOCAL_STEPS_SCHEDULES,
           'K_t schedule; --local_steps is K_0.', feeds=(('RoundSchedules', 'local_steps'),)),
        _f('local_steps_decay', None, 'exp: K_t = ceil(K_0 d^t), d in (0, 1].',
           check=flag_checks.DECAY_FACTOR),
        _f('local_steps_theory_b', None, 'theory: K_t = max(K_0/(b+t), 1).',
           check=flag_checks.NON_NEGATIVE),
        _i('schedule_window', None, 'error schedules: rolling window s (default 100).',
           check=flag_checks.POSITIVE_INT, feeds=(('ErrorDrivenDecay', 'window'),)),
        _i('plateau_patience', None, 'step schedules: evaluations without improvement before '
           'dividing by 10 (default 10).', check=flag_checks.POSITIVE_INT),
        _f('plateau_min_delta', None, 'step schedules: smallest improvement (1e-4).',
           check=flag_checks.NON_NEGATIVE),
        *lr_schedule_flags('client'),
        *lr_schedule_flags('server'),
        _f('step_time_seconds', 0.0, 'Runtime model: compute seconds per minibatch β.',
           check=flag_checks.NON_NEGATIVE),
        _b('measure_step_time', False, 'Runtime model: measure β on this machine.'),
        _f('download_mbps', 20.0, 'Runtime model: client download bandwidth D.',
           check=flag_checks.POSITIVE),
        _f('upload_mbps', 5.0, 'Runtime model: client upload bandwidth U.',
           check=flag_checks.POSITIVE),
    ]),
    ('personalized', 'Personalised FL (thesis ch. 4; docs/mtfl.md)', [
        _e('private', 'all', ('all', 'mu_sigma', 'gamma_beta', 'none'),
           'MTFL: batch-norm values each client keeps private (its patch): all = (μ, σ, γ, β); '
           'none = plain FL.', ('mtfl',), feeds=(('patch_layout', 'private'),)),
        _e('mtfl_strategy', 'fedavg', ('fedavg', 'fedadam', 'fedavg_adam'),
           'MTFL optimisation strategy: fedavg (SGD clients, average), fedadam (server Adam), '
           'fedavg_adam (Adam clients, averaged moments; private moments of private γ, β).',
           ('mtfl',), feeds=(('mtfl', 'strategy'),)),
        _f('perfedavg_beta', 0.001, 'Per-FedAvg meta step size β (α is --client_learning_rate).',
           ('perfedavg',), check=flag_checks.POSITIVE, feeds=(('perfedavg', 'beta'),)),
        _f('pfedme_lambda', 15.0, 'pFedMe regularisation λ.', ('pfedme',),
           check=flag_checks.POSITIVE, feeds=(('pfedme', 'lam'),)),
        _f('pfedme_personal_learning_rate', 0.01, 'pFedMe inner (personal) step η_p.',
           ('pfedme',), check=flag_checks.POSITIVE, feeds=(('pfedme', 'personal_learning_rate'),)),
        _i('pfedme_inner_steps', 1, 'pFedMe inner steps per local step (the thesis: 1).',
           ('pfedme',), check=flag_checks.POSITIVE_INT, feeds=(('pfedme', 'inner_steps'),)),
        _f('pfedme_beta', 1.0, 'pFedMe server mixing β.', ('pfedme',), check=flag_checks.POSITIVE,
           feeds=(('pfedme', 'beta'),)),
        _f('noisy_client_fraction', 0.0, 'This fraction of clients gets fixed Gaussian noise on '
           'its training inputs; user accuracy is averaged over the other clients.',
           PERSONALIZED, check=flag_checks.UNIT_INTERVAL),
        _f('noise_stddev', 0.2, 'Standard deviation of the noisy clients\' input noise.',
           PERSONALIZED, check=flag_checks.NON_NEGATIVE),
        _s('client_state_dir', '', 'Where each client\'s private state is kept (default '
           '<experiment dir>/client_state).',
           Having('keeps_client_state', 'the algorithms whose clients keep state')),
    ]),
    ('diagnostics', 'Diagnostics', [
        _b('measure_client_drift', False, 'Report client_drift/{delta,model}_cosine_distance '
           'each round: mean pairwise cosine distance between the sampled clients\' updates Δ_i '
           '(delta) or final weights (model), FedGBO paper Fig. 6.1. Costs two extra float64 sums of '
           'model size per client per round (simulation only, not counted in cost/ bits).',
           _DRIFT),
    ]),
    ('preset', 'Paper presets (workflow/flags/presets.py)', [
        _s('preset', '', 'Set a paper\'s published settings, <paper>:<task> (e.g. '
           'fedgbo:femnist, fedopt:emnist_character, decayk:femnist). Flags given on the command '
           'line win; --data_dir is never set by a preset.'),
    ]),
    ('loop', 'Training loop and output', [
        _i('total_rounds', 100, 'Total rounds (may be raised when resuming).',
           check=flag_checks.POSITIVE_INT),
        _i('rounds_per_eval', 5, 'Evaluate every this many rounds.',
           check=flag_checks.POSITIVE_INT),
        _i('first_eval_round', 0, 'Evaluate only from this round on (every --rounds_per_eval '
           'rounds; the last round always); 0: from the first. For a measure over a last window '
           '(FedOpt paper: the last 100 rounds\' mean accuracy) without evaluating the whole run.',
           check=flag_checks.NON_NEGATIVE_INT),
        _i('eval_stride', 1, 'Evaluate on every k-th example of the test set (1: all of it); '
           'for large test sets such as LEAF Shakespeare\'s.', check=flag_checks.POSITIVE_INT),
        _i('rounds_per_checkpoint', 10, 'Checkpoint every this many rounds.',
           check=flag_checks.POSITIVE_INT),
        _s('root_output_dir', 'runs', 'Root directory for experiment outputs.'),
        _s('experiment_name', '', 'Experiment directory name. Default: <task>_<algorithm>, '
           'then -flag=value for each flag that changes the computation and differs from its '
           'default (the algorithm\'s default where it has one); long suffixes end in a hash. '
           'Rerunning the same command resumes.'),
        _i('seed', 0, 'Seed for data splits, client sampling and shuffling.',
           check=(flag_checks.NON_NEGATIVE_INT, flag_checks.SEED)),
        _b('show_progress', True, 'Show a progress bar.'),
        _s('together', '', 'A JSON file holding a list of bin/train command lines (each a '
           'list of flags): run them as one process, a population whose client phase is one '
           'program over (member x client) (docs/training.md); no other flag with it. '
           'bin/sweep.py --together writes it.'),
    ]),
    ('reliability', 'Reliability: when a run stops, resuming damaged runs (docs/reliability.md)', [
        _f('divergence_factor', 10.0, 'Stop (exit 1) when the training loss exceeds this '
           'multiple of the initial model\'s loss for --divergence_rounds consecutive rounds '
           '(non-finite values always stop a run); 0 turns the rule off.',
           check=(flag_checks.NON_NEGATIVE, flag_checks.DIVERGENCE_FACTOR)),
        _i('divergence_rounds', 3, 'Consecutive rounds above --divergence_factor x the initial '
           'loss that stop a run.', check=flag_checks.POSITIVE_INT),
        _b('trust_command_line', False, 'Resume a run whose flags.json is missing or damaged '
           'with this command\'s flags (recorded anew, and run: its hyperparameters replace '
           'the checkpoint\'s).'),
    ]),
    ('execution', 'Execution: local runtime and workers (docs/workers.md)', [
        _e('execution', 'cohort', ('cohort', 'per_client'), 'How a round runs. cohort: the '
           'sampled clients as one compiled program (padded client tensors; the fastest on one '
           'machine, docs/performance.md), wherever the algorithm and aggregator allow, else per '
           'client (the reason is printed at start); per_client: each client its own call of a '
           'TFF computation.'),
        _e('cohort_mode', 'auto', ('auto', 'vectorized', 'sequential'), 'Cohort execution: '
           'clients vectorised (tf.vectorized_map; recurrent models: one program over the '
           'clients with the client axis on the weights, when their layers have that form) or in '
           'sequence; auto: in sequence for models with convolutions or recurrent layers without '
           'that form, else vectorised.',
           feeds=(('CohortExecution', 'mode'),)),
        _e('cohort_jit_compile', 'auto', ('auto', 'none', 'step', 'program'), 'Cohort '
           'execution, XLA: program compiles the whole round program (for rounds of one shape: '
           'fixed --local_steps; the digits MLP ~1.5x faster), step each client step (recurrent '
           'models in sequence: the Shakespeare GRU ~3x faster), none; auto: none for recurrent '
           'models vectorised, step for those in sequence, program for fixed --local_steps '
           'without convolutions, else none (CohortExecution).'),
        _i('intra_op_threads', 0, 'TensorFlow\'s intra-op threads (one op split over '
           'threads). 0: 1 for the tasks with recurrent models in the local cohort with '
           'vectorised clients and no XLA (the auto defaults), whose step is independent chains '
           'of small ops on the inter-op threads (the Shakespeare GRU round 0.60 s against 0.75 '
           's, docs/performance.md), TensorFlow\'s default (the cores) otherwise.', check=flag_checks.NON_NEGATIVE_INT,
           feeds=(('set_intra_op_threads', 'threads'),)),
        _i('execution_concurrency', 0, 'Max concurrent client computations in TFF\'s C++ '
           'runtime. 0: two per CPU core (the fastest measured, docs/performance.md); -1: '
           'unlimited (TFF\'s default).', check=flag_checks.EXECUTION_CONCURRENCY),
        _s('workers', '', 'Comma-separated host:port of TFF workers started with bin/worker.py; '
           'each round\'s clients are split across them. Empty: run locally. '
           '--execution_concurrency does not apply (pass --max_concurrent_computation_calls to '
           'each worker).', feeds=(('parse_addresses', None),)),
        _b('worker_retry', False, 'When a worker is lost mid-round, re-run the round on the '
           'remaining workers instead of failing.'),
        _b('data_on_workers', False, 'Workers build client datasets from client ids (the task\'s '
           'serializable dataset function) instead of receiving them; file-based tasks need '
           'their data at the same --data_dir on every worker. With --workers and the cohort '
           'execution each worker gets its shard\'s ids and builds the padded shard itself '
           '(ids split by count, not grouped by size; no client cache or prefetch; batch shapes '
           'must not vary after the rows); without --workers rounds run per client.',
           feeds=(('compose_data_on_workers', None), ('compose_cohort_data_on_workers', None),
                  ('RoundSchedules', 'data_on_workers'))),
    ]),
]

FLAGS_BY_NAME: dict[str, Flag] = {f.name: f for _, _, group in GROUPS for f in group}
DEFAULTS: dict[str, Any] = {name: f.default for name, f in FLAGS_BY_NAME.items()}
# The flags a run's config holds (flags.json); --preset is expanded, not kept.
TRAIN_FLAG_NAMES: tuple[str, ...] = tuple(n for n in FLAGS_BY_NAME if n != 'preset')
GROUP_OF: dict[str, str] = {f.name: key for key, _, group in GROUPS for f in group}
# (owner, argument) of a library ArgumentError → the flag that sets the argument.
ARGUMENT_FLAGS: dict[tuple[Optional[str], Optional[str]], str] = {
    fed: f.name for _, _, group in GROUPS for f in group for fed in f.feeds}


def absl_module_name(group_key: str) -> str:
  """The absl "module" of a group's flags: `--helpfull` prints one section per group, in order."""
  index = [key for key, _, _ in GROUPS].index(group_key)
  return f'bin/train.py flags {index + 1:02d}: {group_key}'


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines every flag of the table on `flag_values` (once; a second call does nothing)."""
  if 'task' in flag_values and 'total_rounds' in flag_values:
    return
  for key, _, group in GROUPS:
    module = absl_module_name(key)
    for f in group:
      help_ = _absl_help(f)
      common = dict(flag_values=flag_values, module_name=module)
      if f.kind == 'string':
        flags.DEFINE_string(f.name, f.default, help_, **common)
      elif f.kind == 'enum':
        flags.DEFINE_enum(f.name, f.default, list(f.values), help_, **common)
      elif f.kind == 'integer':
        flags.DEFINE_integer(f.name, f.default, help_, **common)
      elif f.kind == 'float':
        flags.DEFINE_float(f.name, f.default, help_, **common)
      elif f.kind == 'bool':
        flags.DEFINE_bool(f.name, f.default, help_, **common)
      else:
        raise ValueError(f'unknown flag kind {f.kind!r} of --{f.name}')


def _absl_help(f: Flag) -> str:
  text = f.help
  if isinstance(f.algorithms, Having):
    text += f' Read by: {f.algorithms.who} (bin/train.py --help names them).'
  elif f.algorithms:
    text += f' Read by: {", ".join(f.algorithms)}.'
  return text


def config_from_flags(flag_values: flags.FlagValues) -> dict[str, Any]:
  """The run config (TRAIN_FLAG_NAMES) of parsed `flag_values`."""
  return {k: flag_values[k].value for k in TRAIN_FLAG_NAMES if k in flag_values}


def explicit_flags(flag_values: flags.FlagValues) -> set[str]:
  """Flags given on the command line."""
  return {k for k in TRAIN_FLAG_NAMES if k in flag_values and flag_values[k].present}

