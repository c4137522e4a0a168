"""Statistics over questions clustered in documents: the study's intervals, tests and contrast table.

A study asks several questions of each document, so questions from one document share its difficulty and are not
independent. The document is the unit of replication: every interval and test here resamples or models documents,
never questions. Inputs are per-question arrays aligned with `docs`, an array of document ids (any hashable).

    accuracy(correct, docs)              a proportion with a cluster-bootstrap or GEE interval
    paired_difference(a, b, docs)        mean of a - b, paired cluster-bootstrap interval, clustered test, discordance
    clustered_mcnemar(a, b, docs)        McNemar for clustered matched pairs (Durkalski 2003 or Obuchowski 1998)
    noninferiority(a, b, docs, margin)   one-sided test against a margin stated in advance
    equivalence(a, b, docs, margin)      two one-sided tests (TOST) against a margin stated in advance
    holm(pvalues)                        Holm's step-down adjustment, in input order
    verdict(result)                      the words a result allows ("higher", "no difference shown (p = 0.3)", ...)
    outcome(result)                      the same decision as a number (+1 higher / shown, -1 lower, 0 neither)
    Contrast, ContrastPlan, ContrastTable
                                         contrasts declared before the data are read; one Holm family; one row each

Two routes, each chosen once and stated where it is used:

    bootstrap   resample documents with replacement, keep every question (and every pair) of a drawn document;
                the estimate of a replicate is sum(values) / sum(questions) over the drawn documents; percentile
                interval. Used for `accuracy` and `paired_difference` intervals.
    SE          the mean over questions is a ratio estimator, d = sum_k D_k / sum_k n_k (D_k the sum of document
                k's values, n_k its questions, K documents). Its cluster-robust (linearised) standard error is
                    se = sqrt(K / (K - 1) * sum_k (D_k - n_k * d) ** 2) / sum_k n_k
                referred to Student's t with K - 1 degrees of freedom. With one question per document this is the
                paired t-test exactly (se = s / sqrt(n)), so non-inferiority and equivalence reduce to statsmodels'
                `ttost_paired`. Used for `noninferiority`, `equivalence` and the continuous difference's p-value.

Non-inferiority and equivalence use the SE route only, so that a claim has one route and no choice after the fact.

Optional dependencies: scipy and statsmodels (the `notebooks` extra) are imported where they are used, so that
`import sparsekv.analysis.clustered` works in a core install.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

KINDS = ("difference", "non-inferiority", "equivalence")
_CHUNK = 1 << 20                                     # bootstrap index draws per block (8 MiB of int64)


# -- results --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Accuracy:
    """A proportion of questions answered correctly, with an interval at `level` that treats documents as units."""
    estimate: float                                  # the proportion (GEE: the exchangeable-weighted one, see accuracy)
    lo: float
    hi: float
    level: float                                     # coverage of [lo, hi], e.g. 0.95
    n_questions: int
    n_docs: int
    method: str                                      # "bootstrap", "gee", or "wilson-docs" (the all-equal fallback)
    note: str = ""                                   # why a fallback was taken; empty when none was


@dataclass(frozen=True)
class McNemar:
    """A clustered McNemar test of "a and b are equally often right" on paired binary outcomes."""
    statistic: float                                 # chi-square with 1 degree of freedom
    p: float                                         # two-sided
    a_only: int                                      # questions only a answered correctly (summed over documents)
    b_only: int                                      # questions only b answered correctly
    n_docs: int
    method: str                                      # "durkalski" or "obuchowski"
    direction: int                                   # sign of the statistic's numerator: +1 a more often right, -1 b


@dataclass(frozen=True)
class Difference:
    """mean(a - b) over questions, a paired cluster-bootstrap interval and a clustered two-sided test of zero."""
    estimate: float                                  # mean over questions of a - b (accuracy points / 100, or nats)
    lo: float                                        # percentile interval of the paired cluster bootstrap
    hi: float
    level: float
    se: float                                        # cluster-robust standard error (the SE route), for reference
    p: float                                         # binary: clustered McNemar; continuous: cluster-robust t, K - 1 df
    test: str                                        # "durkalski", "obuchowski" or "t"
    direction: int                                   # the test's own sign (+1, -1, 0); differs from the estimate's
    binary: bool                                     #   sign only when the test weights documents differently
    a_only: int | None                               # discordant counts (binary outcomes only)
    b_only: int | None
    n_questions: int
    n_docs: int
    note: str = ""


@dataclass(frozen=True)
class NonInferiority:
    """One-sided test that a is not worse than b by `margin` or more (SE route, t with K - 1 df).

    higher_is_better: H0 mean(a - b) <= -margin against H1 mean(a - b) > -margin (accuracy).
    lower is better:  H0 mean(a - b) >= +margin against H1 mean(a - b) < +margin (a divergence, in nats).
    Declared iff p < alpha, which is the same as the (1 - 2 alpha) interval's relevant end lying beyond the margin."""
    estimate: float
    lo: float                                        # (1 - 2 alpha) two-sided interval: its one end is the one-sided
    hi: float                                        #   (1 - alpha) bound the decision uses
    se: float
    df: int
    margin: float
    alpha: float
    higher_is_better: bool
    p: float
    non_inferior: bool
    binary: bool
    a_only: int | None
    b_only: int | None
    n_questions: int
    n_docs: int
    note: str = ""


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests (TOST) of -margin < mean(a - b) < +margin (SE route, t with K - 1 df).

    Declared iff p = max(p_lower, p_upper) < alpha, which is the same as the (1 - 2 alpha) interval lying inside
    (-margin, +margin)."""
    estimate: float
    lo: float                                        # (1 - 2 alpha) interval
    hi: float
    se: float
    df: int
    margin: float
    alpha: float
    p_lower: float                                   # H0 mean <= -margin
    p_upper: float                                   # H0 mean >= +margin
    p: float                                         # max(p_lower, p_upper)
    equivalent: bool
    binary: bool
    a_only: int | None
    b_only: int | None
    n_questions: int
    n_docs: int
    note: str = ""


# -- input checks and document sums (private) ----------------------------------------------------------------------

class _Clusters(NamedTuple):
    index: np.ndarray                                # (N,) int64: each question's document, 0..K-1 in first-seen order
    sizes: np.ndarray                                # (K,) float64: questions per document
    n_docs: int


def _clusters(docs, n: int, need: int = 2) -> _Clusters:
    """Map `docs` (N hashable ids) to document indices; ValueError unless aligned and with >= `need` documents."""
    if isinstance(docs, (str, bytes)) or not hasattr(docs, "__len__"):
        raise TypeError(f"docs must be a sequence of document ids, one per question, got {type(docs).__name__}")
    if len(docs) != n:
        raise ValueError(f"docs must have one id per question: got {len(docs)} ids for {n} questions")
    seen: dict = {}
    index = np.empty(n, dtype=np.int64)
    for i, d in enumerate(docs.tolist() if isinstance(docs, np.ndarray) else docs):
        if d is None or (isinstance(d, float) and math.isnan(d)):
            raise ValueError(f"docs must hold document ids, got {d!r} at position {i}")
        if not isinstance(d, Hashable):
            raise TypeError(f"docs must hold hashable document ids, got {type(d).__name__} at position {i}")
        index[i] = seen.setdefault(d, len(seen))
    if len(seen) < need:
        raise ValueError(f"docs must name at least {need} documents (a variance across documents needs two), "
                         f"got {len(seen)}")
    sizes = np.bincount(index, minlength=len(seen)).astype(np.float64)
    return _Clusters(index, sizes, len(seen))


def _values(x, name: str, binary: bool = False) -> np.ndarray:
    """`x` as a (N,) float64 array: non-empty, 1-D, finite, and 0/1 when `binary`."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a sequence of numbers, got {type(x).__name__}: {e}") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite, got {int((~np.isfinite(arr)).sum())} non-finite values")
    if binary and not np.isin(arr, (0.0, 1.0)).all():
        raise ValueError(f"{name} must be binary (0/1 or bool), got values such as "
                         f"{arr[~np.isin(arr, (0.0, 1.0))][:3].tolist()}")
    return arr


def _is_binary(*arrays: np.ndarray) -> bool:
    return all(np.isin(a, (0.0, 1.0)).all() for a in arrays)


def _pair(a, b, docs, binary: bool | None):
    """Validated (a, b, clusters, binary) for paired outcomes."""
    if binary is not None and not isinstance(binary, bool):
        raise TypeError(f"binary must be True, False or None (detect), got {binary!r}")
    a, b = _values(a, "a", bool(binary)), _values(b, "b", bool(binary))
    if a.size != b.size:
        raise ValueError(f"a and b must be paired (one value per question each), got {a.size} and {b.size}")
    cl = _clusters(docs, a.size)
    return a, b, cl, _is_binary(a, b) if binary is None else binary


def _level(level: float, name: str = "level") -> float:
    if not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"{name} must be in (0, 1), e.g. 0.95, got {level!r}")
    return float(level)


def _alpha(alpha: float) -> float:
    if not isinstance(alpha, (int, float)) or not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), e.g. 0.05, got {alpha!r}")
    return float(alpha)


def _margin(margin: float) -> float:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0:
        raise ValueError(f"margin must be a finite number > 0 in the outcome's units (0.05 = 5 points), "
                         f"got {margin!r}")
    return float(margin)


def _reps_seed(reps: int, seed: int) -> None:
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 100:
        raise ValueError(f"reps must be an int >= 100 (bootstrap replicates), got {reps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int (intervals are reproducible), got {seed!r}")


def _doc_sums(values: np.ndarray, cl: _Clusters) -> np.ndarray:
    return np.bincount(cl.index, weights=values, minlength=cl.n_docs)          # (K,) float64


def _discordant(a: np.ndarray, b: np.ndarray, cl: _Clusters) -> tuple[np.ndarray, np.ndarray]:
    """Per-document counts of questions only a got right and only b got right: two (K,) float64 arrays."""
    return _doc_sums(a * (1 - b), cl), _doc_sums((1 - a) * b, cl)


def _bootstrap(sums: np.ndarray, sizes: np.ndarray, reps: int, seed: int) -> np.ndarray:
    """(reps,) replicate means: each draws K documents with replacement and divides their value sum by their
    question count (every question of a drawn document comes with it, so pairs stay paired)."""
    k = sums.size
    rng = np.random.default_rng(seed)
    out = np.empty(reps)
    step = max(1, _CHUNK // k)
    for start in range(0, reps, step):
        idx = rng.integers(0, k, size=(min(step, reps - start), k))            # (r, K) drawn documents
        out[start:start + idx.shape[0]] = sums[idx].sum(1) / sizes[idx].sum(1)
    return out


def _percentile(reps: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    lo, hi = np.quantile(reps, [tail, 1 - tail])
    return float(lo), float(hi)


def _robust(sums: np.ndarray, sizes: np.ndarray) -> tuple[float, float]:
    """The ratio mean sum(D_k) / sum(n_k) and its cluster-robust standard error (module docstring)."""
    k, n = sums.size, sizes.sum()
    mean = sums.sum() / n
    se = math.sqrt(k / (k - 1) * float(((sums - sizes * mean) ** 2).sum())) / n
    return float(mean), float(se)


# -- one proportion -------------------------------------------------------------------------------------------------

def accuracy(correct, docs, *, level: float = 0.95, method: str = "bootstrap", reps: int = 2000,
             seed: int = 0) -> Accuracy:
    """The proportion of questions answered correctly, with an interval that treats documents as the units.

    correct: (N,) binary (bool or 0/1), one per question; docs: (N,) document ids; at least 2 documents.
    method:
      "bootstrap"  the proportion over questions; percentile interval of `reps` cluster-bootstrap replicates
                   (documents drawn with replacement, `seed`ed).
      "gee"        statsmodels GEE, Binomial family (logit link), intercept only, groups = docs, Exchangeable working
                   correlation, robust (sandwich) covariance; Wald interval on the logit scale mapped back by the
                   logistic function, so it stays inside (0, 1). With unequal document sizes the exchangeable
                   weights make the estimate a weighted proportion (a document of n questions weighs
                   n / (1 + (n - 1) rho)); with equal sizes, or one question per document, it is the sample
                   proportion.
    When every outcome is equal (all wrong or all right) the logit is unbounded and a bootstrap interval collapses to
    a point; either method then returns the Wilson interval of K documents counted as one observation each (the
    smallest effective sample size clustering allows), with method "wilson-docs" and a note saying so.
    """
    y = _values(correct, "correct", binary=True)
    cl = _clusters(docs, y.size)
    level = _level(level)
    if method not in ("bootstrap", "gee"):
        raise ValueError(f"method must be 'bootstrap' or 'gee', got {method!r}")
    _reps_seed(reps, seed)
    n, k = y.size, cl.n_docs
    if y.min() == y.max():
        from statsmodels.stats.proportion import proportion_confint
        lo, hi = proportion_confint(int(y[0]) * k, k, alpha=1 - level, method="wilson")
        word = "right" if y[0] else "wrong"
        return Accuracy(float(y[0]), float(lo), float(hi), level, n, k, "wilson-docs",
                        f"all {n} answers {word}: {method} cannot give an interval; Wilson interval over the "
                        f"{k} documents, one observation each")
    if method == "bootstrap":
        lo, hi = _percentile(_bootstrap(_doc_sums(y, cl), cl.sizes, reps, seed), level)
        return Accuracy(float(y.mean()), lo, hi, level, n, k, "bootstrap")
    import warnings

    from scipy.stats import norm
    from statsmodels.genmod.cov_struct import Exchangeable
    from statsmodels.genmod.families import Binomial
    from statsmodels.genmod.generalized_estimating_equations import GEE
    with warnings.catch_warnings(record=True) as caught:                      # kept in the note, never hidden
        warnings.simplefilter("always")
        fit = GEE(y, np.ones((n, 1)), groups=cl.index, family=Binomial(), cov_struct=Exchangeable()).fit()
    beta, se = float(fit.params[0]), float(fit.bse[0])
    z = float(norm.ppf(0.5 + level / 2))
    note = "; ".join(dict.fromkeys(str(w.message) for w in caught))
    return Accuracy(_expit(beta), _expit(beta - z * se), _expit(beta + z * se), level, n, k, "gee", note)


def _expit(t: float) -> float:
    return 1 / (1 + math.exp(-t))


# -- paired outcomes ------------------------------------------------------------------------------------------------

def clustered_mcnemar(a, b, docs, *, method: str = "durkalski") -> McNemar:
    """McNemar's test for matched pairs of binary outcomes clustered in documents (chi-square, 1 df, two-sided).

    With b_k, c_k the questions of document k that only a, only b answered correctly, n_k its questions, K documents:

      "durkalski"   Durkalski V.L., Palesch Y.Y., Lipsitz S.R., Rust P.F. (2003), "Analysis of clustered
                    matched-pair data", Statistics in Medicine 22:2417-2428, in the form of the CRAN package
                    clust.bin.pair 0.1.2 (Gopstein):
                        X2 = (sum_k (b_k - c_k) / n_k) ** 2 / sum_k ((b_k - c_k) / n_k) ** 2
                    It weighs every document equally. With one question per document it is McNemar's
                    (b - c) ** 2 / (b + c) exactly. Yang, Sun & Hardin (2010, Biometrical Journal 52:638-652)
                    recommend it for unequal cluster sizes and fewer than ~50 clusters: this study's case.
      "obuchowski"  Obuchowski N.A. (1998), "On the comparison of correlated proportions for clustered data",
                    Statistics in Medicine 17:1495-1507; the ratio estimator's variance under H0 (pooled
                    proportion), in Yang et al.'s (2010) simplified form:
                        X2 = (K - 1) / K * (sum_k (b_k - c_k)) ** 2 / sum_k (b_k - c_k) ** 2
                    It weighs every question equally. With one question per document it is (N - 1) / N times
                    McNemar's. The most conservative of the two in Yang et al.'s simulations.
    No discordant pair at all gives X2 = 0 and p = 1.
    """
    from scipy.stats import chi2
    a, b, cl, _ = _pair(a, b, docs, binary=True)
    if method not in ("durkalski", "obuchowski"):
        raise ValueError(f"method must be 'durkalski' or 'obuchowski', got {method!r}")
    b_k, c_k = _discordant(a, b, cl)
    d = b_k - c_k if method == "obuchowski" else (b_k - c_k) / cl.sizes          # (K,)
    num, den = float(d.sum()) ** 2, float((d ** 2).sum())
    stat = 0.0 if den == 0 else num / den
    if method == "obuchowski":
        stat *= (cl.n_docs - 1) / cl.n_docs
    return McNemar(stat, float(chi2.sf(stat, 1)), int(b_k.sum()), int(c_k.sum()), cl.n_docs, method,
                   int(np.sign(d.sum())))


def paired_difference(a, b, docs, *, level: float = 0.95, reps: int = 2000, seed: int = 0,
                      binary: bool | None = None, test: str = "durkalski") -> Difference:
    """mean(a - b) over questions, its paired cluster-bootstrap percentile interval, and a two-sided p-value.

    a, b: (N,) paired outcomes of two methods on the same questions (binary: right/wrong; continuous: e.g. a KL in
    nats); docs: (N,) document ids, at least 2 documents. binary: None detects it (every value 0 or 1).
    p-value: binary outcomes use `clustered_mcnemar(method=test)`; continuous ones the SE route's t statistic,
    mean / se with K - 1 degrees of freedom (a zero se with a non-zero mean gives p = 0, with a note).
    The interval and the test are different routes (bootstrap, moments) and can disagree near their boundary.
    """
    from scipy.stats import t as student
    a, b, cl, binary = _pair(a, b, docs, binary)
    level = _level(level)
    _reps_seed(reps, seed)
    if test not in ("durkalski", "obuchowski"):
        raise ValueError(f"test must be 'durkalski' or 'obuchowski', got {test!r}")
    d = a - b
    sums = _doc_sums(d, cl)
    mean, se = _robust(sums, cl.sizes)
    lo, hi = _percentile(_bootstrap(sums, cl.sizes, reps, seed), level)
    note, a_only, b_only = "", None, None
    if binary:
        mc = clustered_mcnemar(a, b, docs, method=test)
        p, name, direction, a_only, b_only = mc.p, mc.method, mc.direction, mc.a_only, mc.b_only
    else:
        name, direction = "t", int(np.sign(mean))
        if se > 0:
            p = float(2 * student.sf(abs(mean) / se, cl.n_docs - 1))
        else:
            p = 1.0 if mean == 0 else 0.0
            note = "zero variance across documents: every document's difference is proportional to its size"
    return Difference(mean, lo, hi, level, se, p, name, direction, binary, a_only, b_only, a.size, cl.n_docs, note)


def _se_route(a, b, docs, binary):
    """(mean, se, df, clusters, binary, a_only, b_only) of a - b for the one-sided tests."""
    a, b, cl, binary = _pair(a, b, docs, binary)
    mean, se = _robust(_doc_sums(a - b, cl), cl.sizes)
    a_only = b_only = None
    if binary:
        b_k, c_k = _discordant(a, b, cl)
        a_only, b_only = int(b_k.sum()), int(c_k.sum())
    return mean, se, cl.n_docs - 1, cl, binary, a_only, b_only


_DEGENERATE = ("zero variance across documents: the SE route cannot measure uncertainty, so no claim is made "
               "(p = 1)")


def noninferiority(a, b, docs, margin: float, *, alpha: float = 0.05, higher_is_better: bool = True,
                   binary: bool | None = None) -> NonInferiority:
    """Is a non-inferior to b within `margin` (stated before the data were read)? SE route, t with K - 1 df.

    a, b: (N,) paired outcomes; docs: (N,) ids, >= 2 documents; margin > 0 in the outcome's units (0.05 = 5
    accuracy points; nats for a divergence). higher_is_better: True for accuracy (a may be at most `margin` below
    b), False for a loss or divergence (a may be at most `margin` above b). With one question per document, p is
    statsmodels' `ttost_paired(a, b, -margin, +margin)` lower-threshold p (upper-threshold when lower is better).
    A zero cluster-robust variance makes no claim (p = 1, note).
    """
    from scipy.stats import t as student
    margin, alpha = _margin(margin), _alpha(alpha)
    if not isinstance(higher_is_better, bool):
        raise TypeError(f"higher_is_better must be a bool, got {higher_is_better!r}")
    mean, se, df, cl, binary, a_only, b_only = _se_route(a, b, docs, binary)
    half = float(student.ppf(1 - alpha, df)) * se
    note = ""
    if se == 0:
        p, note = 1.0, _DEGENERATE
    elif higher_is_better:
        p = float(student.sf((mean + margin) / se, df))                      # H0: mean <= -margin
    else:
        p = float(student.cdf((mean - margin) / se, df))                     # H0: mean >= +margin
    return NonInferiority(mean, mean - half, mean + half, se, df, margin, alpha, higher_is_better, p, p < alpha,
                          binary, a_only, b_only, cl.index.size, cl.n_docs, note)


def equivalence(a, b, docs, margin: float, *, alpha: float = 0.05, binary: bool | None = None) -> Equivalence:
    """Are a and b equivalent within ±`margin` (stated before the data were read)? TOST on the SE route.

    Equivalent iff both one-sided tests reject at `alpha`, i.e. iff the (1 - 2 alpha) interval mean ± t(1 - alpha,
    K - 1) * se lies inside (-margin, +margin). With one question per document p equals statsmodels'
    `ttost_paired(a, b, -margin, +margin)`. A zero cluster-robust variance makes no claim (p = 1, note).
    """
    from scipy.stats import t as student
    margin, alpha = _margin(margin), _alpha(alpha)
    mean, se, df, cl, binary, a_only, b_only = _se_route(a, b, docs, binary)
    half = float(student.ppf(1 - alpha, df)) * se
    note = ""
    if se == 0:
        p_lower = p_upper = 1.0
        note = _DEGENERATE
    else:
        p_lower = float(student.sf((mean + margin) / se, df))                # H0: mean <= -margin
        p_upper = float(student.cdf((mean - margin) / se, df))               # H0: mean >= +margin
    p = max(p_lower, p_upper)
    return Equivalence(mean, mean - half, mean + half, se, df, margin, alpha, p_lower, p_upper, p, p < alpha, binary,
                       a_only, b_only, cl.index.size, cl.n_docs, note)


# -- multiplicity and words -----------------------------------------------------------------------------------------

def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm-adjusted p-values, in the order given: statsmodels `multipletests(pvalues, method="holm")`."""
    from statsmodels.stats.multitest import multipletests
    p = _values(pvalues, "pvalues")
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"pvalues must lie in [0, 1], got {p[(p < 0) | (p > 1)][:3].tolist()}")
    return multipletests(p, method="holm")[1]


def _fmt_p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.2g}"


def _fmt_margin(margin: float, binary: bool, unit: str) -> str:
    if binary:
        return f"{margin * 100:g} points"
    return f"{margin:g} {unit}".rstrip()


def outcome(result: Difference | NonInferiority | Equivalence, *, alpha: float = 0.05, p: float | None = None) -> int:
    """What `result` allows at `alpha`, as a number (`verdict` words the same decision; findings and reports count
    with this, never by parsing words): a Difference, +1 "higher" (a above b), -1 "lower", 0 "no difference shown"
    or a direction the test and the mean disagree on; a NonInferiority or Equivalence, 1 shown, 0 not shown.
    `p` replaces the result's p-value (e.g. Holm-adjusted)."""
    alpha = _alpha(alpha)
    if p is None:
        p = result.p
    elif not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p!r}")
    if p >= alpha:
        return 0
    if isinstance(result, Difference):
        sign = int(np.sign(result.estimate))
        return sign if result.direction == sign else 0
    if isinstance(result, (NonInferiority, Equivalence)):
        return 1
    raise TypeError(f"result must be a Difference, NonInferiority or Equivalence, got {type(result).__name__}")


def verdict(result: Difference | NonInferiority | Equivalence, *, alpha: float = 0.05, p: float | None = None,
            unit: str = "") -> str:
    """The words `result` allows at `alpha`, from its test only; `p` replaces its p-value (e.g. Holm-adjusted).

    Difference:     "higher (p = ...)" / "lower (p = ...)" (a relative to b), else "no difference shown (p = ...)";
                    never "equal" or "same": failing to find a difference is not evidence of equality.
    NonInferiority: "non-inferior within 5 points (p = ...)", else "not shown non-inferior within 5 points (...)".
    Equivalence:    "equivalent within ±5 points (p = ...)", else "not shown equivalent within ±5 points (...)".
    Margins of binary outcomes are in accuracy points (0.05 -> "5 points"); others carry `unit` (e.g. "nats").
    """
    alpha = _alpha(alpha)
    if p is None:
        p = result.p
    elif not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p!r}")
    shown, decided = _fmt_p(p), outcome(result, alpha=alpha, p=p)        # the decision is `outcome`'s
    if isinstance(result, Difference):
        if p >= alpha:
            return f"no difference shown ({shown})"
        if decided == 0:
            return (f"direction unclear: the test ({result.test}) and the mean over questions point different "
                    f"ways ({shown})")
        return f"{'higher' if decided > 0 else 'lower'} ({shown})"
    why = "; no variance across documents to test" if getattr(result, "note", "") == _DEGENERATE else ""
    if isinstance(result, NonInferiority):
        within = f"non-inferior within {_fmt_margin(result.margin, result.binary, unit)}"
        return f"{within} ({shown})" if decided else f"not shown {within} ({shown}{why})"
    if isinstance(result, Equivalence):
        within = f"equivalent within ±{_fmt_margin(result.margin, result.binary, unit)}"
        return f"{within} ({shown})" if decided else f"not shown {within} ({shown}{why})"
    raise TypeError(f"result must be a Difference, NonInferiority or Equivalence, got {type(result).__name__}")


# -- the pre-declared family ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Contrast:
    """One comparison, declared before the data are read: method_a against method_b.

    kind "difference" tests mean(a - b) = 0 (no margin); "non-inferiority" and "equivalence" need a margin > 0 in
    the outcome's units (0.05 = 5 accuracy points; nats for a divergence). higher_is_better orients
    non-inferiority (False for a loss or a divergence). unit names a continuous outcome's unit in verdicts. binary:
    None detects it from the outcomes (all 0/1); False keeps a continuous outcome that happens to be 0/1 continuous.
    """
    name: str
    method_a: str
    method_b: str
    kind: str = "difference"
    margin: float | None = None
    higher_is_better: bool = True
    unit: str = ""
    binary: bool | None = None

    def __post_init__(self):
        for field in ("name", "method_a", "method_b"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{field} must be a non-empty string, got {value!r}")
        if self.method_a == self.method_b:
            raise ValueError(f"method_a and method_b must differ, both are {self.method_a!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "difference":
            if self.margin is not None:
                raise ValueError(f"margin must be None for a 'difference' contrast, got {self.margin!r}")
        else:
            _margin(self.margin)
        if not isinstance(self.higher_is_better, bool):
            raise TypeError(f"higher_is_better must be a bool, got {self.higher_is_better!r}")
        if self.binary is not None and not isinstance(self.binary, bool):
            raise TypeError(f"binary must be True, False or None (detect), got {self.binary!r}")


@dataclass(frozen=True)
class ContrastRow:
    """One declared contrast's result: raw and Holm-adjusted p side by side; the verdict uses the adjusted one."""
    name: str
    kind: str
    method_a: str
    method_b: str
    margin: float | None
    estimate: float                                  # mean(a - b) over questions
    lo: float                                        # difference: bootstrap interval at the plan's level;
    hi: float                                        #   non-inferiority / equivalence: (1 - 2 alpha) SE interval
    level: float                                     # the coverage of [lo, hi]
    p_raw: float
    p_adj: float                                     # Holm over the whole plan
    a_only: int | None                               # discordant counts (binary outcomes)
    b_only: int | None
    verdict: str
    n_questions: int = 0                             # paired questions behind the estimate
    n_docs: int = 0                                  # documents they come from (the unit of replication)
    outcome: int = 0                                 # the verdict as a number (`outcome`, on p_adj): count with this


class ContrastPlan:
    """The study's family of contrasts, fixed before any outcome is read.

    Invariants:
    1. The contrasts are a tuple given at construction, with unique names; a plan has no method that adds,
       removes or renames one.
    2. `digest` is a SHA-256 of the contrasts and the settings (alpha, level, reps, seed, test); a study records it
       before the run, and `evaluate(..., digest=recorded)` refuses a plan that differs from the recorded one.
    3. `evaluate` computes every declared contrast and Holm-adjusts over all of them: the family cannot be narrowed
       after the data are seen.
    4. Its ContrastTable holds exactly the declared rows, in declared order, and refuses any other name.
    """

    def __init__(self, contrasts: Sequence[Contrast], *, alpha: float = 0.05, level: float = 0.95, reps: int = 2000,
                 seed: int = 0, test: str = "durkalski"):
        contrasts = tuple(contrasts)
        if not contrasts:
            raise ValueError("contrasts must declare at least one Contrast")
        for c in contrasts:
            if not isinstance(c, Contrast):
                raise TypeError(f"contrasts must hold Contrast objects, got {type(c).__name__}")
        names = [c.name for c in contrasts]
        if len(set(names)) != len(names):
            raise ValueError(f"contrasts must have unique names, got {sorted(n for n in set(names) if names.count(n) > 1)}")
        if test not in ("durkalski", "obuchowski"):
            raise ValueError(f"test must be 'durkalski' or 'obuchowski', got {test!r}")
        _reps_seed(reps, seed)
        self._contrasts = contrasts
        self.alpha, self.level, self.reps, self.seed, self.test = _alpha(alpha), _level(level), reps, seed, test

    @property
    def contrasts(self) -> tuple[Contrast, ...]:
        return self._contrasts

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self._contrasts)

    @property
    def digest(self) -> str:
        body = {"contrasts": [vars(c) for c in self._contrasts], "alpha": self.alpha, "level": self.level,
                "reps": self.reps, "seed": self.seed, "test": self.test}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def evaluate(self, outcomes: Mapping[str, Sequence[float]], docs, *, digest: str | None = None) -> ContrastTable:
        """Every declared contrast on `outcomes` (method name -> (N,) per-question outcomes, aligned with `docs`).
        Methods the plan does not name are ignored; a missing one is a ValueError."""
        if not isinstance(outcomes, Mapping):
            raise TypeError(f"outcomes must map method names to per-question outcomes, got {type(outcomes).__name__}")
        missing = sorted({m for c in self._contrasts for m in (c.method_a, c.method_b)} - set(outcomes))
        if missing:
            raise ValueError(f"outcomes has no entry for declared methods {missing}")
        return self.evaluate_pairs({c.name: (outcomes[c.method_a], outcomes[c.method_b], docs) for c in self._contrasts},
                                   digest=digest)

    def evaluate_pairs(self, pairs: Mapping[str, tuple], *, digest: str | None = None) -> ContrastTable:
        """Every declared contrast on its own paired outcomes: contrast name -> (a, b, docs), each (N,) and aligned,
        N and the documents free to differ between contrasts (a study whose contrasts sit in different cells).
        One Holm family over all of them; a contrast without outcomes is a ValueError."""
        if digest is not None and digest != self.digest:
            raise ValueError(f"digest does not match this plan: recorded {digest[:12]}..., plan {self.digest[:12]}...; "
                             f"the contrasts or settings changed after they were recorded")
        if not isinstance(pairs, Mapping):
            raise TypeError(f"pairs must map contrast names to (a, b, docs), got {type(pairs).__name__}")
        missing = [n for n in self.names if n not in pairs]
        if missing:
            raise ValueError(f"pairs has no outcomes for declared contrasts {missing}")
        results = []
        for c in self._contrasts:
            a, b, docs = pairs[c.name]
            if c.kind == "difference":
                r = paired_difference(a, b, docs, level=self.level, reps=self.reps, seed=self.seed, test=self.test,
                                      binary=c.binary)
                level = r.level
            elif c.kind == "non-inferiority":
                r = noninferiority(a, b, docs, c.margin, alpha=self.alpha, higher_is_better=c.higher_is_better,
                                   binary=c.binary)
                level = 1 - 2 * self.alpha
            else:
                r = equivalence(a, b, docs, c.margin, alpha=self.alpha, binary=c.binary)
                level = 1 - 2 * self.alpha
            results.append((c, r, level))
        adjusted = holm([r.p for _, r, _ in results])
        rows = tuple(ContrastRow(c.name, c.kind, c.method_a, c.method_b, c.margin, r.estimate, r.lo, r.hi, level, r.p,
                                 float(q), r.a_only, r.b_only, verdict(r, alpha=self.alpha, p=float(q), unit=c.unit),
                                 r.n_questions, r.n_docs, outcome(r, alpha=self.alpha, p=float(q)))
                     for (c, r, level), q in zip(results, adjusted))
        return ContrastTable(self, rows)


class ContrastTable:
    """The rows of one evaluated ContrastPlan, in declared order (ContrastPlan's invariants 3 and 4).

    table["name"] returns a declared row; any other name raises KeyError. The constructor refuses rows that are not
    exactly the plan's contrasts, in order, so a table cannot gain a contrast named after the data were seen.
    """

    def __init__(self, plan: ContrastPlan, rows: Sequence[ContrastRow]):
        rows = tuple(rows)
        if tuple(r.name for r in rows) != plan.names:
            raise ValueError(f"rows must be exactly the plan's declared contrasts {list(plan.names)}, in order, "
                             f"got {[r.name for r in rows]}")
        self.plan, self._rows = plan, rows

    @property
    def rows(self) -> tuple[ContrastRow, ...]:
        return self._rows

    def __getitem__(self, name: str) -> ContrastRow:
        for r in self._rows:
            if r.name == name:
                return r
        raise KeyError(f"{name!r} is not a declared contrast; the plan declared {list(self.plan.names)}")

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def records(self) -> list[dict]:
        """One dict per row (for a metrics JSON or a DataFrame)."""
        return [vars(r).copy() for r in self._rows]

    def __str__(self) -> str:
        head = f"{'contrast':<24} {'estimate':>9} {'interval':>21} {'p':>8} {'p (Holm)':>8} {'a/b only':>9}  verdict"
        lines = [head]
        for r in self._rows:
            disc = "" if r.a_only is None else f"{r.a_only}/{r.b_only}"
            lines.append(f"{r.name:<24} {r.estimate:>9.4f} [{r.lo:>8.4f}, {r.hi:>8.4f}] {r.p_raw:>8.3g} "
                         f"{r.p_adj:>8.3g} {disc:>9}  {r.verdict}")
        return "\n".join(lines)
