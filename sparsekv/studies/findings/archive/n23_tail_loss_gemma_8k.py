"""Archived notebook 23's finding (`notebooks/archive/23_tail_loss_gemma_8k.ipynb`): notebook 22's tail-loss harness
on Gemma 3 270M at 8k tokens."""
from ...tail_loss.findings import tail_finding

N23 = "23_tail_loss_gemma_8k"                   # tail loss of every family, Gemma 3 at 8k

FINDINGS = (tail_finding(N23, "gemma_8k", "Gemma 3 270M", " (routers route and presses compress its 3 global "
                         "layers; its sliding layers hold their window exactly)"),)
