"""Triton kernels, installed as `sparsekv.kernels` (never as a top-level `kernels`).

    paged_decode  split-K paged block-sparse decode attention, and its split merge
    block_score   Quest min/max and MoBA mean block logits from the per-block summaries

Importing this package does not import triton; each module does, so `sparsekv` works on
machines without it. On a CPU, run the kernels with TRITON_INTERPRET=1 set before import.
The dispatcher in `sparsekv.attention` / `sparsekv.routing` chooses them with backend="triton".
"""
