"""Every finding of docs/findings.md, in the page's order: the one place that lists the notebook modules.

The order is the page's argument, not notebook number (04's cost of routing follows 01's mass recall; 16's router
follows the paired studies it answers). A new notebook's findings are a new `nNN_<stem>.py` and one entry here.
"""
from ..tail_loss import findings as n22_tail_loss
from . import (
    n01_dense_vs_sparse_baselines,
    n03_lost_detail_probes,
    n04_hbm_traffic,
    n05_prefix_cache_agents,
    n06_model_decode,
    n07_end_to_end_recall,
    n08_real_model,
    n10_tiering,
    n11_serving_agents,
    n12_hybrid_long_context,
    n13_routers,
)
from .archive import (
    n09_lossless_vs_lossy,
    n14_paired_questions,
    n15_paired_questions_gemma,
    n16_router_halves,
    n17_paired_questions_gemma_8k,
    n18_two_turn_dialogues,
    n19_question_rule,
    n20_paired_questions_gemma_16k,
    n21_task_family_gemma,
    n23_tail_loss_gemma_8k,
)
from .finding import Finding

NOTEBOOKS = (
    n01_dense_vs_sparse_baselines,      # routers on synthetic keys: mass, cost, detail, breaking points
    n04_hbm_traffic,
    n03_lost_detail_probes,
    n05_prefix_cache_agents,            # prefix caching
    n06_model_decode,                   # models: random weights, trained here, pretrained
    n07_end_to_end_recall,
    n08_real_model,
    n09_lossless_vs_lossy,              # (archived) equal bytes
    n10_tiering,                        # systems: tiers, serving, a hybrid model
    n11_serving_agents,
    n12_hybrid_long_context,
    n13_routers,                        # routers against the oracle, then the paired-question studies
    n14_paired_questions,               # (archived)
    n15_paired_questions_gemma,         # (archived)
    n17_paired_questions_gemma_8k,      # (archived)
    n18_two_turn_dialogues,             # (archived)
    n19_question_rule,                  # (archived)
    n20_paired_questions_gemma_16k,     # (archived)
    n21_task_family_gemma,              # (archived)
    n16_router_halves,                  # (archived)
    n22_tail_loss,                      # tail loss of every family
    n23_tail_loss_gemma_8k,             # (archived)
)

FINDINGS: tuple[Finding, ...] = tuple(f for notebook in NOTEBOOKS for f in notebook.FINDINGS)
