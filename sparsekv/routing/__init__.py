"""Layer 3 (the runtime): query-aware routing: scorers and selectors (registries), the router, and the true block mass
the oracle ranks by. Imports `storage` and `core`, never attention or above.
"""
