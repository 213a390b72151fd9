#!/usr/bin/env bash
# Run from the project checkout's root. Prepares the ignored folder .whl-gpu/ that a call of the
# `device` tool carries to an NVIDIA GPU machine (carry: [".whl-gpu"]): the pure-Python wheels
# chunkx and its conformance peers need there that the machine's image lacks or may hold at other
# versions (it has JAX with CUDA, Python 3.12, pytest; quantax and netket, whose dependencies
# are compiled, are not carried: their conformance tests skip), and on-gpu.sh, which installs
# them and runs a command. Then, in the device call:
#   bash .whl-gpu/on-gpu.sh python3 benchmarks/bench_accelerator.py --out $OUT/accelerator_gpu.json
#   bash .whl-gpu/on-gpu.sh python3 benchmarks/tpu_suite.py run --out $OUT --seconds 480 tests/maps
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p .whl-gpu
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
grep -qx '/.whl-gpu/' "$ex" 2>/dev/null || echo '/.whl-gpu/' >> "$ex"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for p in equinox==0.13.8 beartype==0.23.1 jaxtyping==0.3.11 wadler_lindig==0.1.8 \
         optax==0.2.8 adv-jax-math==1.3 t3toolbox==2026.2.0 pytest-timeout; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl-gpu "$p" 2>&1 | grep -v '^WARNING' || true
done
cp "$here/on-gpu.sh" .whl-gpu/on-gpu.sh
ls .whl-gpu
