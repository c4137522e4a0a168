"""Layer 2 (the runtime): the lossless KV store: block pool, block store with per-block summaries, the prefix cache and
its eviction policies. Imports only `core`.
"""
