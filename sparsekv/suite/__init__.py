"""Layer 8 (research): the notebook suite's machinery, which knows no study: the papermill runner and the Ray sweep,
metrics and checks (`report`), regression against baselines, CPU configurations, an AVX2-only view of the CPU
(`avx2_view`) and threads, stored grids, the explorers (`explore` computes, `explorers` draws), figures' shared style
(`viz`, `canvas`), the generated blocks of markdown pages and the book. The studies (layer 9) import it; it imports
no study.
"""
