#!/usr/bin/env bash
# On the GPU machine, from the project checkout's root: install the carried wheels under /tmp/site
# ahead of the image's own packages (its JAX, with CUDA, stays: none is carried), put src/ on the
# path, then run "$@". JAX takes memory as it needs it (no preallocation), so XLA's and the
# planner's view of free memory is the device's. Outputs written under $OUT come back.
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl-gpu/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export CHUNKX_CACHE_DIR=${CHUNKX_CACHE_DIR:-$(mktemp -d)}
python3 -c 'import jax, equinox, chunkx; print("jax", jax.__version__, "equinox", equinox.__version__, jax.devices())' 2>&1 | grep -v Warn
exec "$@"
