"""The tail-loss study (`studies.tail_loss`, notebooks 22 and 23): its configuration's errors, its statistics over
documents on hand-made rows (against scipy), the contrasts declared from the configuration alone, and one document
scored end to end on a tiny random Llama against a direct computation."""
import numpy as np
import pytest
import torch

from sparsekv.analysis import peers
from sparsekv.studies import questions as qs
from sparsekv.studies.tail_loss import report as tail_report
from sparsekv.studies.tail_loss import study as tl


@pytest.mark.parametrize("kw, arg", [
    ({"kinds": ("poetry",)}, "kinds"), ({"kinds": ()}, "kinds"), ({"docs": 0}, "docs"), ({"length": 1.5}, "length"),
    ({"tail": 129}, "tail"), ({"tail": 0}, "tail"), ({"budget": 2000}, "budget"), ({"scorers": ("nope",)}, "scorers"),
    ({"int8_scorers": ("nope",)}, "int8_scorers"), ({"presses": ("NopePress",)}, "presses"), ({"bits": (3,)}, "bits"),
    ({"prefill": "fp8"}, "prefill"), ({"docs": True}, "docs"), ({"doc0": -1}, "doc0"), ({"doc0": 1.0}, "doc0"),
    ({"router": "minmax", "scorers": ("halves",)}, "router"), ({"margin": 0}, "margin"), ({"margin": True}, "margin")])
def test_a_bad_configuration_names_its_argument(kw, arg):
    with pytest.raises(ValueError, match=rf"^{arg} must"):
        tl.TailConfig("model.gguf", **kw)
    cfg = tl.TailConfig("model.gguf", scorers=["halves"], bits=[8])
    assert cfg.scorers == ("halves",) and cfg.bits == (8,) and cfg.prefix == 2048 - 128 - 1


def _rows(values: dict) -> list[dict]:
    """{(kind, method): [[nll per token] per doc]} -> rows."""
    return [{"kind": k, "doc": d, "method": m, "token": t, "nll": x}
            for (k, m), docs in values.items() for d, xs in enumerate(docs) for t, x in enumerate(xs)]


def _study(values: dict, int8: bool = False) -> tl.TailStudy:
    docs = len(next(iter(values.values())))
    cfg = tl.TailConfig("model.gguf", kinds=("prose",), docs=docs, length=64, tail=2, budget=8, scorers=("halves",
                        "minmax", "oracle"), int8_scorers=("halves",) if int8 else (),
                        presses=("SnapKVPress", "KnormPress"), bits=(8, 2))
    Router = __import__("sparsekv").Router
    lossless = [qs.Lossless("dense")] + [qs.Lossless(f"{s}@8", Router(s, token_budget=8), 8) for s in cfg.scorers]
    if int8:
        lossless += [qs.Lossless("int8 dense", kv_bits=8), qs.Lossless("int8 halves@8", Router("halves", token_budget=8),
                                                                        8, kv_bits=8)]
    st = tl.TailStudy(cfg, "tiny", None, lossless, qs.peer_methods(cfg.presses, [8], cfg.prefix, cfg.bits),
                      rows=_rows(values))
    tl.summarize(st)
    return st


def test_each_method_is_paired_with_its_own_engine_s_dense_over_documents():
    """A method's excess is over its own engine's dense, its interval and test resample or model documents: with
    equal tokens per document the clustered t-test is scipy's one-sample t-test of the per-document mean excesses."""
    st = _study({("prose", "dense"): [[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]],
                 ("prose", "hf dense"): [[1.0, 2.0], [3.0, 1.5], [2.0, 2.0]],
                 ("prose", "halves@8"): [[1.5, 2.0], [3.0, 1.0], [2.2, 2.4]],
                 ("prose", "minmax@8"): [[2.0, 2.0], [3.0, 1.0], [2.0, 2.0]],
                 ("prose", "oracle@8"): [[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]],
                 ("prose", "SnapKV@8"): [[1.0, 2.0], [3.0, 2.5], [2.0, 2.2]],
                 ("prose", "Knorm@8"): [[1.0, 3.0], [3.0, 2.5], [2.0, 2.0]],
                 ("prose", "hqq8"): [[1.0, 2.0], [3.0, 1.5], [2.0, 2.0]],
                 ("prose", "hqq2"): [[4.0, 4.0], [4.0, 4.0], [4.0, 4.0]]})
    from scipy import stats
    s = st.summary
    assert s[("prose", "halves@8")]["delta"] == pytest.approx((0.5 + 0.2 + 0.4) / 6)    # over sparsekv dense
    assert s[("prose", "halves@8")]["docs_worse"] == 2 and s[("prose", "halves@8")]["docs"] == 3
    assert s[("prose", "SnapKV@8")]["delta"] == pytest.approx((1.0 + 0.2) / 6)          # over transformers dense
    assert s[("prose", "halves@8")]["p"] == pytest.approx(stats.ttest_1samp([0.25, 0.0, 0.3], 0).pvalue)
    lo, hi = s[("prose", "halves@8")]["lo"], s[("prose", "halves@8")]["hi"]
    assert 0 <= lo < s[("prose", "halves@8")]["delta"] < hi <= 0.3 + 1e-12          # within the document means
    assert s[("prose", "hqq2")]["nll"] == pytest.approx(4.0)
    assert s[("prose", "dense")]["delta"] == 0 and s[("prose", "hf dense")]["delta"] == 0
    assert st.agree["prose"]["mean"] == pytest.approx(-0.5 / 6) and st.agree["prose"]["docs"] == 3
    with pytest.raises(ValueError, match="no common token"):
        tl.paired_delta(st.rows, "code", "dense", "hqq8")


def test_the_contrasts_are_declared_from_the_configuration_never_from_the_losses():
    """The named router faces every press and HQQ 8/4 (no "best" picked), the family is the same whatever the losses,
    and Holm runs over all of it (checked against statsmodels)."""
    from statsmodels.stats.multitest import multipletests
    rng = np.random.default_rng()
    names = ("dense", "hf dense", "halves@8", "minmax@8", "oracle@8", "SnapKV@8", "Knorm@8", "hqq8", "hqq2",
             "int8 dense", "int8 halves@8")
    plans = []
    for _ in range(2):
        values = {("prose", m): rng.normal(2, 0.3, (5, 3)).tolist() for m in names}
        st = _study(values, int8=True)
        plans.append(st.contrasts.plan)
    assert plans[0].digest == plans[1].digest
    assert [c.name for c in plans[0].contrasts] == [
        "prose: hqq2 vs hqq8", "prose: oracle@8 vs minmax@8", "prose: halves@8 vs SnapKV@8",
        "prose: halves@8 vs Knorm@8", "prose: halves@8 vs hqq8", "prose: int8 halves@8 no worse than halves@8"]
    ni = st.contrasts["prose: int8 halves@8 no worse than halves@8"]
    assert (ni.kind, ni.margin) == ("non-inferiority", 0.02) and not st.contrasts.plan.contrasts[-1].higher_is_better
    raw = [r.p_raw for r in st.contrasts]
    assert [r.p_adj for r in st.contrasts] == pytest.approx(multipletests(raw, method="holm")[1])
    m, _ = tl.metrics(st, "t")
    assert m["contrast.t.prose.halves@8_vs_SnapKV@8.p_holm"] == st.contrasts["prose: halves@8 vs SnapKV@8"].p_adj
    assert m["contrast.t.prose.halves@8_vs_SnapKV@8.docs"] == 5
    assert not any(k.startswith("best.") for k in m)


def _noisy(delta: dict, docs: int = 8, seed: int = 0) -> dict:
    """Rows whose per-document excess over dense is `delta[method]` plus a little noise (dense: 1.0 per token)."""
    rng = np.random.default_rng(seed)
    out = {}
    for m in ("dense", "hf dense", "halves@8", "minmax@8", "oracle@8", "SnapKV@8", "Knorm@8", "hqq8", "hqq2"):
        base = 0.0 if m in ("dense", "hf dense") else delta[m]
        out[("prose", m)] = [(1.0 + base + rng.normal(0, 0.01, 2)).tolist() for _ in range(docs)]
    return out


def test_the_checks_read_the_contrasts_they_name():
    st = _study(_noisy({"halves@8": 0.1, "minmax@8": 0.5, "oracle@8": 0.01, "SnapKV@8": 0.5, "Knorm@8": 1.0,
                        "hqq8": 0.01, "hqq2": 3.0}))
    st.nbytes = {m: {"read": 0.5, "held": 0.5} for m in st.methods}
    st.model_vs_held = {"hf dense": 1.0, "SnapKV@8": 1.004, "hqq8": 1.1}
    c = tail_report.checks(st, "t", min_docs=2)
    assert all(x.passed for x in c.values() if x.role != "hypothesis")
    verdicts = {k.split(" (")[0]: x.passed for k, x in c.items() if x.role == "hypothesis"}
    assert verdicts == {"1. t prose: oracle@8 departs less from dense than minmax@8": True,
                        "2. t prose: halves@8 departs less from dense than SnapKV@8": True,
                        "2. t prose: halves@8 departs less from dense than Knorm@8": True,
                        "3. t prose: HQQ 8-bit departs less from dense than halves@8": True}
    # the other way round: a router worse than a press is no support for "departs less", whatever its p
    st = _study(_noisy({"halves@8": 0.6, "minmax@8": 0.5, "oracle@8": 0.01, "SnapKV@8": 0.1, "Knorm@8": 1.0,
                        "hqq8": 0.7, "hqq2": 3.0}))
    c = tail_report.checks(st, "t", min_docs=2)
    verdicts = {k.split(" (")[0]: x.passed for k, x in c.items() if x.role == "hypothesis"}
    assert not verdicts["2. t prose: halves@8 departs less from dense than SnapKV@8"]
    assert not verdicts["3. t prose: HQQ 8-bit departs less from dense than halves@8"]
    assert "lower than 1 of 2 presses, higher than 1" in tail_report.router_words(st, "prose")
    st.nbytes = {m: {"read": 0.5, "held": 0.5} for m in st.methods}
    st.model_vs_held = {"hf dense": 1.0, "SnapKV@8": 1.02, "hqq8": 1.1}
    assert not all(x.passed for x in tail_report.checks(st, "t", min_docs=2).values() if x.role == "invariant")
    assert not tail_report.checks(st, "t", min_docs=9)["t: documents per kind, at least 9"].passed
    rows = tail_report.table(st)
    assert {r["method"] for r in rows} == set(st.methods) and rows[0]["docs worse"] == "0/8"
    assert [r["contrast"] for r in tail_report.contrast_table(st)] == list(st.contrasts.plan.names)


def test_the_hypotheses_are_read_at_the_plan_s_alpha():
    """Each hypothesis's threshold is the plan's alpha, not a constant: a plan re-evaluated at a far stricter alpha
    (same contrasts, same pairs) turns every supported hypothesis into no support, and its checks say that alpha."""
    from sparsekv.analysis import clustered
    st = _study(_noisy({"halves@8": 0.1, "minmax@8": 0.5, "oracle@8": 0.01, "SnapKV@8": 0.5, "Knorm@8": 1.0,
                        "hqq8": 0.01, "hqq2": 3.0}))
    st.nbytes = {m: {"read": 0.5, "held": 0.5} for m in st.methods}
    st.model_vs_held = {"hf dense": 1.0}
    loose = {k: x for k, x in tail_report.checks(st, "t", min_docs=2).items() if x.role == "hypothesis"}
    assert loose and all(x.passed for x in loose.values())
    strict = clustered.ContrastPlan(st.contrasts.plan.contrasts, alpha=1e-40)
    st.contrasts = strict.evaluate_pairs({c.name: tl._paired(st.rows, "prose", c.method_a, c.method_b)
                                          for c in strict.contrasts})
    tight = {k: x for k, x in tail_report.checks(st, "t", min_docs=2).items() if x.role == "hypothesis"}
    assert tight.keys() == loose.keys() and not any(x.passed for x in tight.values())
    assert {x.threshold for x in tight.values()} == {1e-40}


def test_peer_losses_are_the_next_token_losses_of_the_tail(tiny_llama_hf):
    """Dense's per-token losses are the cross-entropy of one forward pass over the whole document on its last tokens;
    a press that removes nothing gives dense's; a press that removes half does not."""
    hf, n, prefix = tiny_llama_hf, 90, 80          # SnapKV needs more than its 64-token window
    ids = torch.randint(0, 101, (n,), generator=torch.Generator().manual_seed(9)).tolist()
    methods = [peers.PeerMethod("hf dense", "dense"), peers.PeerMethod("none", "evict", "SnapKVPress", 0.0),
               peers.PeerMethod("half", "evict", "SnapKVPress", 0.5), peers.PeerMethod("hqq8", "quant", bits=8,
                                                                                      group=32, residual=16)]
    losses, held = tl.peer_losses(hf, ids, prefix, methods)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, prefix:-1]
    direct = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[prefix + 1:]), reduction="none")
    assert losses["hf dense"].shape == (n - prefix - 1,)
    assert torch.allclose(losses["hf dense"], direct, atol=1e-5)
    assert torch.allclose(losses["none"], direct, atol=1e-5)
    assert not torch.allclose(losses["half"], direct, atol=1e-3)
    assert held["half"] < held["hf dense"] and held["hqq8"] < held["hf dense"]


def test_cells_written_apart_are_read_back_as_one_study(tmp_path):
    """Two cells of documents (a sweep's) give the study the rows of both; a cell rerun is read once; cells that
    differ in more than their documents are refused, naming the field."""
    import dataclasses
    import json
    full = _study(_noisy({"halves@8": 0.1, "minmax@8": 0.5, "oracle@8": 0.01, "SnapKV@8": 0.5, "Knorm@8": 1.0,
                          "hqq8": 0.01, "hqq2": 3.0}, docs=6))
    full.nbytes = {m: {"read": 0.5, "held": 0.5} for m in full.methods}
    for d0, n, where in ((0, 4, "a"), (4, 2, "b"), (4, 2, "b2")):
        part = dataclasses.replace(full, config=dataclasses.replace(full.config, doc0=d0, docs=n),
                                   rows=[r for r in full.rows if d0 <= r["doc"] < d0 + n],
                                   held_measured={"SnapKV@8": [100.0 + d0]}, held_modelled={"SnapKV@8": 100.0})
        tl.write_cell(part, tmp_path / where / "22_tail_loss.rows.csv")
    st = tl.load_cells(tmp_path)
    assert (st.config.doc0, st.config.docs) == (0, 6) and len(st.rows) == len(full.rows)
    assert st.summary[("prose", "halves@8")]["delta"] == pytest.approx(full.summary[("prose", "halves@8")]["delta"])
    assert st.contrasts.plan.digest == full.contrasts.plan.digest
    assert st.model_vs_held == {"SnapKV@8": pytest.approx(1.04)}
    assert tl.load_cells(tmp_path / "nothing") is None and tl.load_cells("") is None
    info = tmp_path / "b2" / "22_tail_loss.cell.json"
    bad = json.loads(info.read_text())
    bad["config"]["budget"] = 16
    info.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="cells must share every field but .*budget = 16"):
        tl.load_cells(tmp_path)
    with pytest.raises(ValueError, match="rows_path must end in '.rows.csv'"):
        tl.write_cell(full, tmp_path / "rows.csv")
