"""Layer 4 (the runtime): attention over the store: decode (dense, sparse, batched), prefill, and the decode plan
that validates a step once. Imports `routing`, `storage`, `core` and the kernels.
"""
