"""Layer 3 (the runtime): query-aware routing: scorers and selectors (registries), the router, and the true block mass
the oracle ranks by. Imports `storage` and `core`, never attention or above.
"""

# The hierarchical scorers register beside the flat ones whenever any routing module is imported (SCORERS is
# complete however routing is reached: `sparsekv.Router`, or `sparsekv.routing.scorers` directly).
from . import hierarchy  # noqa: E402,F401
