"""Statistics over questions clustered in documents: reductions to the unclustered tests, Holm, the pre-declared
contrast table, equivalence and non-inferiority against statsmodels, coverage under clustering, and bad input."""
import dataclasses

import numpy as np
import pytest
from scipy.stats import ttest_rel
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint
from statsmodels.stats.weightstats import ttost_paired

from sparsekv.analysis import clustered as cs

Z95 = 1.959963984540054


def singletons(n):
    return np.arange(n)                                      # one question per document


def clustered_accuracy(rng, k, m, a=1.0, b=1.0):
    """k documents of m questions; a document's difficulty is Beta(a, b), its questions Bernoulli of it."""
    docs = np.repeat(np.arange(k), m)
    p = rng.beta(a, b, k)
    return rng.random(k * m) < p[docs], docs


# -- with one question per document the clustered statistics are the unclustered ones ------------------------------

@pytest.mark.parametrize("seed,n,pa,pb", [(0, 200, 0.6, 0.5), (1, 57, 0.7, 0.7), (2, 400, 0.3, 0.45)])
def test_clustered_mcnemar_with_singleton_documents_is_mcnemar(seed, n, pa, pb):
    rng = np.random.default_rng(seed)
    a, b = rng.random(n) < pa, rng.random(n) < pb
    table = [[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]]
    ref = mcnemar(table, exact=False, correction=False)
    d = cs.clustered_mcnemar(a, b, singletons(n))
    assert d.statistic == pytest.approx(ref.statistic, rel=1e-12)           # Durkalski: McNemar exactly
    assert d.p == pytest.approx(ref.pvalue, rel=1e-10)
    assert (d.a_only, d.b_only) == (table[0][1], table[1][0])                 # discordant counts
    o = cs.clustered_mcnemar(a, b, singletons(n), method="obuchowski")
    assert o.statistic == pytest.approx(ref.statistic * (n - 1) / n, rel=1e-12)   # Obuchowski: (N - 1) / N of it


def test_clustered_mcnemar_by_hand():
    # doc 0: 2 questions, a right on both, b on neither; doc 1: 3 questions, b alone right on one; doc 2: 1, a alone
    a = [1, 1, 0, 1, 0, 1]
    b = [0, 0, 1, 1, 0, 0]
    docs = ["d0", "d0", "d1", "d1", "d1", "d2"]
    d = cs.clustered_mcnemar(a, b, docs)
    # (b_k - c_k) / n_k = 1, -1/3, 1: X2 = (5/3)^2 / (1 + 1/9 + 1) = 25/19
    assert d.statistic == pytest.approx(25 / 19, rel=1e-12)
    assert (d.a_only, d.b_only, d.n_docs, d.direction) == (3, 1, 3, 1)
    o = cs.clustered_mcnemar(a, b, docs, method="obuchowski")
    # b_k - c_k = 2, -1, 1: X2 = (K - 1) / K * 2^2 / (4 + 1 + 1) = 4/9
    assert o.statistic == pytest.approx(4 / 9, rel=1e-12)
    assert cs.clustered_mcnemar([1, 0, 1], [1, 0, 1], [0, 1, 2]).p == 1.0    # no discordant pair: p = 1


def test_bootstrap_accuracy_with_singleton_documents_is_a_plain_bootstrap():
    rng = np.random.default_rng(3)
    y = rng.random(300) < 0.62
    acc = cs.accuracy(y, singletons(300), reps=2000, seed=5)
    plain = rng.choice(y, size=(2000, 300)).mean(1)                           # resample questions, another stream
    lo, hi = np.quantile(plain, [0.025, 0.975])
    assert acc.estimate == pytest.approx(y.mean(), abs=1e-12)
    assert acc.lo == pytest.approx(lo, abs=0.012) and acc.hi == pytest.approx(hi, abs=0.012)   # Monte Carlo error
    wlo, whi = proportion_confint(y.sum(), y.size, method="wilson")
    assert acc.lo == pytest.approx(wlo, abs=0.015) and acc.hi == pytest.approx(whi, abs=0.015)  # and near Wilson


def test_gee_with_singleton_documents_is_the_sample_proportion_and_the_logit_wald_interval():
    rng = np.random.default_rng(4)
    y = rng.random(150) < 0.7
    g = cs.accuracy(y, singletons(150), method="gee")
    p = y.mean()
    assert g.estimate == pytest.approx(p, abs=1e-8)                           # GEE's estimate: the proportion
    # robust SE of the logit with independent questions: 1 / sqrt(n p (1 - p)); Wald on the logit scale
    logit, se = np.log(p / (1 - p)), 1 / np.sqrt(150 * p * (1 - p))
    assert g.lo == pytest.approx(1 / (1 + np.exp(-(logit - Z95 * se))), abs=1e-6)
    assert g.hi == pytest.approx(1 / (1 + np.exp(-(logit + Z95 * se))), abs=1e-6)
    assert (g.method, g.n_docs, g.n_questions) == ("gee", 150, 150)


def test_gee_with_equal_document_sizes_is_the_sample_proportion():
    y, docs = clustered_accuracy(np.random.default_rng(5), 30, 4)
    assert cs.accuracy(y, docs, method="gee").estimate == pytest.approx(y.mean(), abs=1e-8)


@pytest.mark.parametrize("method", ["bootstrap", "gee"])
@pytest.mark.parametrize("value", [0, 1])
def test_all_equal_outcomes_fall_back_to_wilson_over_documents(method, value):
    docs = np.repeat(np.arange(8), 3)
    acc = cs.accuracy(np.full(24, value), docs, method=method)
    lo, hi = proportion_confint(8 * value, 8, method="wilson")
    assert (acc.estimate, acc.method) == (value, "wilson-docs")               # no crash, and it says so
    assert (acc.lo, acc.hi) == pytest.approx((lo, hi), abs=1e-12)             # Wilson with K = 8 observations
    assert "8 documents" in acc.note


# -- Holm and the pre-declared contrast table ------------------------------------------------------------------------

def test_holm_equals_multipletests_in_input_order():
    p = np.random.default_rng(6).random(25) ** 3
    assert cs.holm(p) == pytest.approx(multipletests(p, method="holm")[1], abs=1e-15)
    # by hand: sorted 0.01 x 3, 0.03 x 2, 0.04 x 1 (raised to the running max 0.06); input order kept
    assert cs.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06], abs=1e-15)


def study_data(seed=7, k=40, m=4):
    rng = np.random.default_rng(seed)
    docs = np.repeat(np.arange(k), m)
    p = rng.beta(2, 2, k)[docs]
    u = rng.random(k * m)
    dense = u < p
    close = u < p - 0.01                                                      # rarely differs from dense
    worse = u < p - 0.25                                                      # much worse
    kl = np.abs(rng.normal(0.02, 0.01, k * m))
    return {"dense": dense, "close": close, "worse": worse, "kl_close": kl, "kl_zero": np.zeros(k * m)}, docs


PLAN = [cs.Contrast("worse vs dense", "worse", "dense"),
        cs.Contrast("close ni dense", "close", "dense", "non-inferiority", 0.05),
        cs.Contrast("close eq dense", "close", "dense", "equivalence", 0.05),
        cs.Contrast("kl eq", "kl_close", "kl_zero", "equivalence", 0.01, unit="nats")]


def test_contrast_table_keeps_raw_and_adjusted_p_side_by_side():
    outcomes, docs = study_data()
    plan = cs.ContrastPlan(PLAN, reps=500, seed=1)
    table = plan.evaluate(outcomes, docs)
    assert [r.name for r in table] == [c.name for c in PLAN]                  # invariant 4: declared rows, in order
    raw = [cs.paired_difference(outcomes["worse"], outcomes["dense"], docs, reps=500, seed=1).p,
           cs.noninferiority(outcomes["close"], outcomes["dense"], docs, 0.05).p,
           cs.equivalence(outcomes["close"], outcomes["dense"], docs, 0.05).p,
           cs.equivalence(outcomes["kl_close"], outcomes["kl_zero"], docs, 0.01).p]
    assert [r.p_raw for r in table] == pytest.approx(raw, rel=1e-12)         # each row's own test
    assert [r.p_adj for r in table] == pytest.approx(cs.holm(raw), rel=1e-12)  # invariant 3: Holm over the plan
    assert table["worse vs dense"].verdict.startswith("lower")                # a clear loss
    assert table["close eq dense"].verdict.startswith("equivalent within ±5 points")
    assert table["kl eq"].verdict.startswith("not shown equivalent within ±0.01 nats")  # KL 0.02 vs 0: outside
    assert table["worse vs dense"].b_only > table["worse vs dense"].a_only == 0     # discordance kept
    assert table["worse vs dense"].level == 0.95 and table["close ni dense"].level == pytest.approx(0.90)
    assert len(table.records()) == 4 and "p (Holm)" in str(table)


def test_contrast_table_refuses_undeclared_contrasts():
    outcomes, docs = study_data()
    plan = cs.ContrastPlan(PLAN, reps=500)
    table = plan.evaluate(outcomes, docs)
    with pytest.raises(KeyError, match="not a declared contrast"):            # invariant 4: lookup
        table["close vs worse"]
    extra = dataclasses.replace(table.rows[0], name="found later")
    with pytest.raises(ValueError, match="rows must be exactly the plan's declared contrasts"):
        cs.ContrastTable(plan, table.rows + (extra,))                         # invariant 4: no added row
    with pytest.raises(ValueError, match="rows must be exactly"):
        cs.ContrastTable(plan, table.rows[:2])                                # nor a narrowed family
    assert isinstance(plan.contrasts, tuple) and not hasattr(plan, "add")     # invariant 1: fixed at construction
    recorded = plan.digest
    later = cs.ContrastPlan(PLAN + [cs.Contrast("close vs worse", "close", "worse")], reps=500)
    with pytest.raises(ValueError, match="digest does not match"):            # invariant 2: recorded before the run
        later.evaluate(outcomes, docs, digest=recorded)
    assert plan.evaluate(outcomes, docs, digest=recorded).rows == table.rows  # the recorded plan runs as before
    with pytest.raises(ValueError, match="unique names"):
        cs.ContrastPlan([PLAN[0], PLAN[0]])
    with pytest.raises(ValueError, match="no entry for declared methods"):
        plan.evaluate({"dense": outcomes["dense"]}, docs)


# -- non-inferiority and equivalence ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,shift,margin", [(8, 0.05, 0.1), (9, 0.0, 0.05), (10, 0.2, 0.1), (11, -0.08, 0.1)])
def test_equivalence_and_noninferiority_with_singleton_documents_are_ttost_paired(seed, shift, margin):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, 120)
    y = x - shift + rng.normal(0, 0.3, 120)                                   # mean(x - y) near shift
    p, (t1, p1, df1), (t2, p2, df2) = ttost_paired(x, y, -margin, margin)
    e = cs.equivalence(x, y, singletons(120), margin)
    assert (e.p_lower, e.p_upper, e.p) == pytest.approx((p1, p2, p), rel=1e-9)   # TOST p-values
    assert e.df == df1 == 119 and e.equivalent == (p < 0.05)
    assert cs.noninferiority(x, y, singletons(120), margin).p == pytest.approx(p1, rel=1e-9)        # lower threshold
    ni = cs.noninferiority(x, y, singletons(120), margin, higher_is_better=False)
    assert ni.p == pytest.approx(p2, rel=1e-9)                                                      # upper threshold
    assert cs.paired_difference(x, y, singletons(120), reps=200).p == pytest.approx(ttest_rel(x, y).pvalue, rel=1e-9)


def clustered_pairs(rng, k, shift, sd_doc=0.05, sd_q=0.05):
    """Continuous paired outcomes in k documents of 1-4 questions: a document effect on both, a shared document
    effect on the difference, and question noise; mean(a - b) is `shift` in expectation."""
    sizes = rng.integers(1, 5, k)
    docs = np.repeat(np.arange(k), sizes)
    base = rng.normal(0, 1, k)[docs]
    b = base + rng.normal(0, 0.1, docs.size)
    a = b + shift + rng.normal(0, sd_doc, k)[docs] + rng.normal(0, sd_q, docs.size)
    return a, b, docs


def test_equivalence_is_declared_inside_the_margin_and_not_for_a_larger_difference():
    rng = np.random.default_rng(12)
    a, b, docs = clustered_pairs(rng, 60, shift=0.01)
    inside = cs.equivalence(a, b, docs, 0.05)
    assert inside.equivalent and inside.p < 0.05                              # true 0.01, margin 0.05
    a, b, docs = clustered_pairs(rng, 60, shift=0.1)
    outside = cs.equivalence(a, b, docs, 0.05)
    assert not outside.equivalent and outside.p > 0.5                         # true 0.10, margin 0.05
    assert not cs.noninferiority(-a, -b, docs, 0.05).non_inferior             # a worse by 0.10: not non-inferior
    assert cs.noninferiority(a, b, docs, 0.05).non_inferior                   # a better by 0.10: non-inferior
    for margin in np.linspace(0.005, 0.2, 40):                                # declared iff the 90% interval is inside
        e = cs.equivalence(a, b, docs, margin)
        assert e.equivalent == (-margin < e.lo and e.hi < margin), margin
        n = cs.noninferiority(a, b, docs, margin)
        assert n.non_inferior == (n.lo > -margin), margin


def test_se_route_and_paired_cluster_bootstrap_agree_with_many_documents():
    rng = np.random.default_rng(13)
    a, b, docs = clustered_pairs(rng, 300, shift=0.02)
    se = cs.equivalence(a, b, docs, 0.05)                                     # 90% interval, SE route
    boot = cs.paired_difference(a, b, docs, level=0.90, reps=2000, seed=2)    # 90% percentile, paired bootstrap
    width = se.hi - se.lo
    assert boot.estimate == pytest.approx(se.estimate, abs=1e-12)
    assert abs(boot.lo - se.lo) < 0.08 * width and abs(boot.hi - se.hi) < 0.08 * width
    assert boot.se == pytest.approx(se.se, rel=1e-12)


# -- clustering matters ----------------------------------------------------------------------------------------------

def test_the_cluster_interval_is_wider_than_wilson_under_document_variation():
    y, docs = clustered_accuracy(np.random.default_rng(14), 30, 10)           # difficulty ~ Beta(1, 1): ICC 1/3
    acc = cs.accuracy(y, docs, reps=1000)
    lo, hi = proportion_confint(y.sum(), y.size, method="wilson")
    # design effect 1 + (m - 1) ICC = 4: the clustered interval is about twice as wide (2.21x here); demand 1.5x
    assert acc.hi - acc.lo > 1.5 * (hi - lo)


def test_clustered_intervals_cover_and_the_naive_one_does_not():
    # 200 studies of 30 documents x 10 questions, difficulty ~ Beta(1, 1), true accuracy 0.5. Measured with these
    # seeds: cluster bootstrap 0.930, GEE 0.930, question-level Wilson 0.645. Binomial SE of a coverage is 0.015.
    rng = np.random.default_rng(15)
    hits = {"bootstrap": 0, "gee": 0, "wilson": 0}
    for r in range(200):
        y, docs = clustered_accuracy(rng, 30, 10)
        boot = cs.accuracy(y, docs, reps=500, seed=r)
        gee = cs.accuracy(y, docs, method="gee")
        lo, hi = proportion_confint(y.sum(), y.size, method="wilson")
        hits["bootstrap"] += boot.lo <= 0.5 <= boot.hi
        hits["gee"] += gee.lo <= 0.5 <= gee.hi
        hits["wilson"] += lo <= 0.5 <= hi
    cover = {k: v / 200 for k, v in hits.items()}
    assert cover["bootstrap"] >= 0.90 and cover["gee"] >= 0.90, cover        # near 95%
    assert cover["wilson"] <= 0.80, cover                                     # clearly below


def test_clustered_mcnemar_holds_its_level_where_mcnemar_does_not():
    # H0 true on average, but each document leans one way (the share of its discordant pairs that favour a is
    # Beta(0.5, 0.5)): 300 studies of 30 documents x 10 questions. Measured with these seeds: McNemar rejects
    # 0.243, Durkalski 0.047, Obuchowski 0.043 at 5% (binomial SE of a rate near 5%: 0.013).
    rng = np.random.default_rng(16)
    docs = np.repeat(np.arange(30), 10)
    reject = {"mcnemar": 0, "durkalski": 0, "obuchowski": 0}
    for _ in range(300):
        lean = rng.beta(0.5, 0.5, 30)[docs]
        discordant = rng.random(300) < 0.4
        a_wins = rng.random(300) < lean
        both = rng.random(300) < 0.5
        a = np.where(discordant, a_wins, both)
        b = np.where(discordant, ~a_wins, both)
        table = [[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]]
        reject["mcnemar"] += mcnemar(table, exact=False, correction=False).pvalue < 0.05
        for method in ("durkalski", "obuchowski"):
            reject[method] += cs.clustered_mcnemar(a, b, docs, method=method).p < 0.05
    rate = {k: v / 300 for k, v in reject.items()}
    assert rate["mcnemar"] > 0.15, rate                                       # ignores the documents: far above 5%
    assert rate["durkalski"] < 0.09 and rate["obuchowski"] < 0.09, rate      # near 5%


# -- words -----------------------------------------------------------------------------------------------------------

def test_verdict_words_come_from_the_tests_and_never_say_equal():
    rng = np.random.default_rng(17)
    a, b, docs = clustered_pairs(rng, 40, shift=0.0, sd_doc=0.2)
    none = cs.paired_difference(a, b, docs, reps=500)
    assert none.p > 0.05
    word = cs.verdict(none)
    assert word.startswith("no difference shown (p = ") and "equal" not in word and "same" not in word
    assert cs.verdict(cs.paired_difference(a + 0.5, b, docs, reps=500)).startswith("higher")
    assert cs.verdict(cs.paired_difference(a - 0.5, b, docs, reps=500)).startswith("lower")
    assert cs.verdict(cs.paired_difference(a + 0.5, b, docs, reps=500), p=0.2) == "no difference shown (p = 0.2)"
    y, ydocs = clustered_accuracy(rng, 40, 4)
    flipped = y.copy()
    flipped[[3, 50, 101]] ^= True                                             # three discordant questions of 160
    eq = cs.equivalence(y, flipped, ydocs, 0.05)
    assert cs.verdict(eq).startswith("equivalent within ±5 points (p")
    assert cs.verdict(eq, p=0.3) == "not shown equivalent within ±5 points (p = 0.3)"
    ni = cs.noninferiority(y, flipped, ydocs, 0.05)
    assert cs.verdict(ni).startswith("non-inferior within 5 points")
    assert cs.verdict(ni, p=0.5).startswith("not shown non-inferior within 5 points")
    kl = cs.equivalence(a, b, docs, 0.01)
    assert cs.verdict(kl, unit="nats").startswith("not shown equivalent within ±0.01 nats")


@pytest.mark.parametrize("seed", range(12))
def test_outcome_is_the_decision_verdict_words(seed):
    """`outcome` is what reports and findings count: it must be the decision `verdict` words, on fresh data of
    every kind, at the result's own p and at a replaced (Holm) one."""
    rng = np.random.default_rng(100 + seed)
    a, b, docs = clustered_pairs(rng, int(rng.integers(5, 40)), shift=float(rng.normal(0, 0.3)), sd_doc=0.2)
    y, ydocs = clustered_accuracy(rng, int(rng.integers(5, 40)), 4)
    z = y.copy()
    z[rng.choice(len(z), size=int(rng.integers(0, 8)), replace=False)] ^= True
    results = [cs.paired_difference(a, b, docs, reps=300), cs.paired_difference(y, z, ydocs, reps=300),
               cs.noninferiority(y, z, ydocs, 0.05), cs.equivalence(y, z, ydocs, 0.05),
               cs.noninferiority(a, b, docs, 0.1, higher_is_better=False)]
    for r in results:
        for p in (None, float(rng.uniform(0, 0.1)), 0.5):
            o, word = cs.outcome(r, p=p), cs.verdict(r, p=p)
            expected = {1: ("higher", "non-inferior", "equivalent"), -1: ("lower",),
                        0: ("no difference shown", "direction unclear", "not shown")}[o]
            assert word.startswith(expected), (o, word)


def test_outcome_refuses_what_is_not_a_result_or_a_p():
    a, b, docs = clustered_pairs(np.random.default_rng(3), 10, shift=0.5, sd_doc=0.2)
    r = cs.paired_difference(a, b, docs, reps=200)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        cs.outcome(r, p=1.5)
    with pytest.raises(TypeError, match="result must be a Difference"):
        cs.outcome(object(), p=0.01)


def test_zero_variance_makes_no_claim():
    y, docs = clustered_accuracy(np.random.default_rng(18), 10, 4)
    e = cs.equivalence(y, y, docs, 0.05)                                      # identical answers everywhere
    assert (e.equivalent, e.p) == (False, 1.0) and "no claim" in e.note
    assert cs.noninferiority(y, y, docs, 0.05).non_inferior is False


# -- bad input -------------------------------------------------------------------------------------------------------

def test_bad_input_names_the_argument():
    y, docs = [1, 0, 1, 1], [0, 0, 1, 1]
    with pytest.raises(ValueError, match="a and b must be paired"):
        cs.paired_difference([1, 0, 1], y, docs)                              # mismatched pair
    with pytest.raises(ValueError, match="docs must have one id per question"):
        cs.accuracy(y, [0, 1, 1])                                             # mismatched docs
    with pytest.raises(ValueError, match="docs must name at least 2 documents"):
        cs.accuracy(y, [7, 7, 7, 7])                                          # one document
    with pytest.raises(ValueError, match="docs must name at least 2 documents"):
        cs.equivalence([0.1, 0.2], [0.1, 0.3], ["x", "x"], 0.1)
    with pytest.raises(ValueError, match="a must be binary"):
        cs.clustered_mcnemar([0.5, 1, 0, 1], y, docs)                         # McNemar needs 0/1
    with pytest.raises(ValueError, match="correct must be binary"):
        cs.accuracy([2, 0, 1, 1], docs)
    with pytest.raises(ValueError, match="margin must be a finite number > 0"):
        cs.noninferiority(y, y, docs, -0.05)                                  # negative margin
    with pytest.raises(ValueError, match="margin must be a finite number > 0"):
        cs.equivalence(y, y, docs, 0)
    with pytest.raises(ValueError, match="margin must be a finite number > 0"):
        cs.Contrast("x", "a", "b", "equivalence")                             # a margin is required
    with pytest.raises(ValueError, match="margin must be None"):
        cs.Contrast("x", "a", "b", "difference", 0.05)
    with pytest.raises(ValueError, match="kind must be one of"):
        cs.Contrast("x", "a", "b", "superiority")
    with pytest.raises(ValueError, match="alpha must be in"):
        cs.equivalence(y, y, docs, 0.05, alpha=0.5)
    with pytest.raises(ValueError, match="level must be in"):
        cs.accuracy(y, docs, level=95)
    with pytest.raises(ValueError, match="method must be"):
        cs.accuracy(y, docs, method="wald")
    with pytest.raises(ValueError, match="a must be a non-empty"):
        cs.paired_difference([], [], [])
    with pytest.raises(ValueError, match="docs must hold document ids"):
        cs.accuracy(y, [0, 0, None, 1])
    with pytest.raises(ValueError, match="pvalues must lie in"):
        cs.holm([0.1, 1.2])
    with pytest.raises(ValueError, match="reps must be an int >= 100"):
        cs.accuracy(y, docs, reps=10)


def test_agreement_on_every_question_makes_no_claim_and_says_why():
    """Two methods that answer every question alike have no variance across documents: the SE route cannot bound
    the difference, so neither non-inferiority nor equivalence is claimed, and the verdict names the reason."""
    a = np.array([1.0, 0.0, 1.0, 1.0] * 30)
    docs = np.repeat(np.arange(30), 4)
    ni = cs.noninferiority(a, a.copy(), docs, 0.05)
    eq = cs.equivalence(a, a.copy(), docs, 0.05)
    assert ni.p == 1.0 and not ni.non_inferior and eq.p == 1.0
    assert cs.verdict(ni) == "not shown non-inferior within 5 points (p = 1; no variance across documents to test)"
    assert cs.verdict(eq).endswith("(p = 1; no variance across documents to test)")
    b = a.copy()
    b[0] = 0.0                                                          # one discordant question: variance to test
    assert "no variance" not in cs.verdict(cs.noninferiority(a, b, docs, 0.05))
