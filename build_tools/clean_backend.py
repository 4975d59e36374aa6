"""setuptools' PEP 517 build backend, minus what it leaves in the source tree.

`pip wheel .` / `pip install .` run setuptools in the checkout, and setuptools
writes `build/` and `tff_adaptive.egg-info/` there as scratch: untracked files
in the user's clone. Every hook here is setuptools' own, run so that those two
are removed again if they were not there before (a user's own `build/` is left
alone). pyproject.toml names this module with `backend-path`.
"""

import contextlib
import functools
import os
import shutil

from setuptools import build_meta as _setuptools

# setuptools' scratch in the source tree (relative to it: PEP 517 runs hooks there).
SCRATCH = ('build', 'tff_adaptive.egg-info')


@contextlib.contextmanager
def _no_scratch_left():
  absent = [path for path in SCRATCH if not os.path.lexists(path)]
  try:
    yield
  finally:
    for path in absent:
      shutil.rmtree(path, ignore_errors=True)


def _clean(hook):
  @functools.wraps(hook)
  def run(*args, **kwargs):
    with _no_scratch_left():
      return hook(*args, **kwargs)
  return run


get_requires_for_build_wheel = _setuptools.get_requires_for_build_wheel
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
prepare_metadata_for_build_wheel = _clean(_setuptools.prepare_metadata_for_build_wheel)
prepare_metadata_for_build_editable = _clean(_setuptools.prepare_metadata_for_build_editable)
build_wheel = _clean(_setuptools.build_wheel)
build_sdist = _clean(_setuptools.build_sdist)
build_editable = _clean(_setuptools.build_editable)
