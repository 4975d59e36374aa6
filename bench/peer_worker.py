"""One engine of bench/peers.py in one process: build, run the rounds, report.

  python bench/peer_worker.py --engine=ENGINE --data=SETTING.npz --rounds=5 --out=RESULT.json
  python bench/peer_worker.py --engine=prepare --data_dir=DIR --settings=mlp_50x10,...

Run by bench/peers.py with the python of the engine's environment: `ours_auto`,
`ours_per_client`, `tff_fedavg` and `raw` in the package's (TF 2.14);
`pfl_fedavg` and `raw` in pfl-research's; `fedjax_fedavg` in FedJAX's;
`flower_fedavg` and `raw` in Flower's. The result (JSON) has every round's
seconds (the first ones are the warm-up: tracing, compilation), the build
seconds, the loss of the final global weights on all clients' examples
(`peer_common.loss_of`), the engine's versions, and the final weights in an
.npz next to it, which bench/peers.py compares across engines.
"""

import argparse
import importlib
from importlib import metadata
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# engine → (module, class). Modules are imported on demand: pfl's only exists
# in its environment, the package's (TFF) only in the main one.
ENGINES = {
    'raw': ('peer_common', 'RawLoop'),
    'ours_auto': ('peer_ours', 'OursDefault'),
    'ours_sequential': ('peer_ours', 'OursSequential'),
    'ours_per_client': ('peer_ours', 'OursPerClient'),
    'tff_fedavg': ('peer_ours', 'TffFedAvg'),
    'pfl_fedavg': ('peer_pfl', 'PflFedAvg'),
    'fedjax_fedavg': ('peer_fedjax', 'FedjaxFedAvg'),
    'flower_fedavg': ('peer_flower', 'FlowerFedAvg'),
}
VERSION_MODULES = ('numpy', 'tensorflow', 'keras', 'tf_keras', 'tensorflow_federated', 'pfl',
                   'jax', 'haiku', 'fedjax', 'flwr', 'ray')


# module → its distribution's name, where they differ
DISTRIBUTIONS = {'tensorflow_federated': 'tensorflow-federated', 'tf_keras': 'tf-keras',
                 'haiku': 'dm-haiku'}


def versions() -> dict:
  found = {'python': platform.python_version()}
  for name in VERSION_MODULES:
    if name in sys.modules:
      try:
        found[name] = metadata.version(DISTRIBUTIONS.get(name, name))
      except metadata.PackageNotFoundError:
        found[name] = getattr(sys.modules[name], '__version__', '?')
  if 'tff_adaptive' in sys.modules:  # which copy of the package ran (peers.py --package)
    package = sys.modules['tff_adaptive'].__file__
    found['tff_adaptive_from'] = os.path.dirname(os.path.dirname(package))
  return found


def prepare(data_dir: str, names, tiny: bool = False) -> dict:
  import peer_common  # pylint: disable=g-import-not-at-top
  os.makedirs(data_dir, exist_ok=True)
  written = {}
  for name in names:
    setting = peer_common.SETTINGS[name]
    if tiny:  # bench/peers.py --dry_run: the code path in seconds
      setting = setting._replace(clients=2, steps=2, batch=2)
    path = os.path.join(data_dir, f'{name}.npz')
    peer_common.write_setting_data(path, name, setting)
    written[name] = path
  return written


def run_engine(engine: str, data_path: str, rounds: int) -> dict:
  """Builds `engine` on the setting's file, runs `rounds` rounds, returns the result."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import peer_common  # pylint: disable=g-import-not-at-top
  data = peer_common.SettingData(data_path)
  module, cls = ENGINES[engine]
  t0 = time.perf_counter()
  runner = getattr(importlib.import_module(module), cls)(data)
  build_s = time.perf_counter() - t0
  if hasattr(runner, 'run'):  # a framework that runs all its rounds in one call
    times = runner.run(rounds)
  else:
    times = peer_common.time_rounds(runner, rounds)
  weights = runner.weights()
  # An environment without TensorFlow evaluates in its own framework.
  loss = getattr(runner, 'loss', lambda w: peer_common.loss_of(data, w))
  result = dict(engine=engine, setting=data.name, rounds=rounds, round_times_s=times,
                build_s=build_s, final_loss=loss(weights), initial_loss=loss(data.weights),
                versions=versions(),
                notes=getattr(runner, 'notes', ''))
  return result, [np.asarray(w) for w in weights]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--engine', required=True, choices=['prepare'] + sorted(ENGINES))
  p.add_argument('--data', default='', help='the setting file (.npz)')
  p.add_argument('--data_dir', default='', help='prepare: where to write the setting files')
  p.add_argument('--settings', default='', help='prepare: comma list of settings')
  p.add_argument('--tiny', action='store_true', help='prepare: 2 clients × 2 steps × batch 2')
  p.add_argument('--rounds', type=int, default=5)
  p.add_argument('--out', default='', help='result JSON (weights: the same name, .npz)')
  args = p.parse_args(argv)
  if args.engine == 'prepare':
    print(json.dumps(prepare(args.data_dir, [s for s in args.settings.split(',') if s], args.tiny)))
    return
  import numpy as np  # pylint: disable=g-import-not-at-top
  result, weights = run_engine(args.engine, args.data, args.rounds)
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)
  np.savez(os.path.splitext(args.out)[0] + '.npz', *weights)


if __name__ == '__main__':
  main()
