"""A toy press in one file: what adding a press to the equal-bytes study takes (issue 54). It keeps the most recent
tokens of every layer and kv head (a score that grows with position), which StreamingLLM does with sink tokens."""
from dataclasses import dataclass

import torch
from kvpress import ScorerPress


@dataclass
class KeepRecentPress(ScorerPress):
    """Scores each cached token by its position: the newest score highest."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        n = keys.shape[-2]
        return torch.arange(n, dtype=keys.dtype, device=keys.device).expand(keys.shape[:-1]).clone()
