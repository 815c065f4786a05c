#!/usr/bin/env bash
# The wheels that benchmarks/gpu_session.sh needs on a lent GPU machine, which has Python 3.12
# and no network: run here, from the repository root, before the device call, which then names
# .whl in its carry. array-api-compat (anyrope's one required dependency) is all the machine
# lacks: its image holds torch, Triton, CuPy, JAX, numba, pytest, pytest-xdist and hypothesis.
set -eu
grep -qx "/.whl/" .gitignore  # ignored: the wheels travel by carry, never in a commit
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    -d .whl "array-api-compat>=1.11"
ls .whl
