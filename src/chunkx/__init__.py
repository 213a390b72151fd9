"""chunkx: composable chunked maps for JAX."""

from ._combinators._protocol import (
    AbstractAccumulation as AbstractAccumulation,
    AbstractReducer as AbstractReducer,
)
from ._combinators.reduce import (
    Concat as Concat,
    Monoid as Monoid,
    Sum as Sum,
)
from ._combinators.vmap import Vmap as Vmap
from ._combinators.chunk import Chunk as Chunk, Reduce as Reduce
from ._combinators.pad import Pad as Pad
from ._combinators.shard import Shard as Shard
from ._combinators.pullback import Pullback as Pullback
from ._maps.lax_map import map as map
from ._maps.adv import BatchVmap as BatchVmap, batch_map as batch_map, batch_vmap as batch_vmap
from ._maps.vmap import ChunkedVmap as ChunkedVmap, filter_vmap as filter_vmap, vmap as vmap
from ._maps.vectorize import BatchVectorize as BatchVectorize, batch_vectorize as batch_vectorize
from ._maps.jac import BatchJacfwd as BatchJacfwd, BatchJacrev as BatchJacrev
from ._maps.jac import batch_jacfwd as batch_jacfwd, batch_jacrev as batch_jacrev
from ._maps.sparse import (
    check_block_diagonal as check_block_diagonal,
    sparse_pullback as sparse_pullback,
    sparse_pullback_map as sparse_pullback_map,
)
from ._maps.quantax import ChunkMap as ChunkMap, chunk_map as chunk_map
from ._maps.quantax import jit_chunk_vmap as jit_chunk_vmap
from ._maps.netket import apply_chunked as apply_chunked, vmap_chunked as vmap_chunked
from ._maps.netket import ChunkedVjp as ChunkedVjp, vjp_chunked as vjp_chunked
from ._maps._microbatching import AccumulationType as AccumulationType, Accumulator as Accumulator
from ._maps.optax import microbatch as microbatch, micro_vmap as micro_vmap
from ._maps.optax import micro_grad as micro_grad, reshape_batch_axis as reshape_batch_axis
from ._plan.search import MemoryPlan as MemoryPlan, fit_memory as fit_memory
from ._plan.measure import compiled_temp_bytes as compiled_temp_bytes
from ._plan.cache import clear_plan_cache as clear_plan_cache
from ._maps.planning import plan_chunk_size as plan_chunk_size, plan_memory as plan_memory

__version__ = "0.1.0"
