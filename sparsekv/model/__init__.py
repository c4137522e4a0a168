"""Layer 5 (the runtime): a Llama-family decoder on the store, checkpoint loading (HF folders and GGUF files), the
real model's fetcher, and the `Engine` (prefill, routed decode, fork).
"""
