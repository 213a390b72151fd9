"""The memory planner, below the combinators and the maps: how `"auto"` chooses a chunk size.

- `auto.py`: what a `Chunk(size="auto")` / `Chunk(grad_size="auto")` does when traced or
  differentiated (the only place that plans).
- `search.py`: the model of temp memory against chunk size and the searches over it.
- `measure.py`: XLA's compiled temp memory, program fingerprints, the default budget, the
  divisors a search steps through.
- `cache.py`: measurements remembered per fingerprint, in process and on disk.
- `agree.py`: one plan for every process of a multi-process run.
- `reverse.py`: the pieces of reverse-pass planning (closed-over arrays as leaves, the VJP
  program, the `jax.custom_jvp` that plans only when differentiated).
"""
