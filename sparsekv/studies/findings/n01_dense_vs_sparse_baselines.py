"""Notebook 01's finding (`notebooks/01_dense_vs_sparse_baselines.ipynb`): mass recall and bytes read at 128k."""
from .finding import Finding

N01 = "01_dense_vs_sparse_baselines"

FINDINGS = (
    Finding("**At 128k tokens with a 2,048-token budget**, `minmax` keeps {mm:.1%} of the attention mass while "
            "reading {mb:.1%} of dense decode's bytes. `mean` keeps {me:.0%}, and the query-blind `recency` window "
            "keeps {re:.2%} of a multi-needle query's mass (synthetic keys, notebook 01).",
            {"mm": (N01, "minmax.mass_recall@131072"), "mb": (N01, "minmax.bytes_ratio@131072"),
             "me": (N01, "mean.mass_recall@131072"), "re": (N01, "recency.mass_recall@131072")}),
)
