"""The tail-loss study (`studies.tail_loss`, notebooks 22 and 23): its configuration's errors, its paired statistics on
hand-made rows, the best method of each family, and one document scored end to end on a tiny random Llama against
a direct computation."""
import pytest
import torch

from sparsekv.analysis import peers
from sparsekv.studies import questions as qs
from sparsekv.studies import tail_loss as tl
from sparsekv.suite import tail_report


@pytest.mark.parametrize("kw, arg", [
    ({"kinds": ("poetry",)}, "kinds"), ({"kinds": ()}, "kinds"), ({"docs": 0}, "docs"), ({"length": 1.5}, "length"),
    ({"tail": 129}, "tail"), ({"tail": 0}, "tail"), ({"budget": 2000}, "budget"), ({"scorers": ("nope",)}, "scorers"),
    ({"int8_scorers": ("nope",)}, "int8_scorers"), ({"presses": ("NopePress",)}, "presses"), ({"bits": (3,)}, "bits"),
    ({"prefill": "fp8"}, "prefill"), ({"docs": True}, "docs")])
def test_a_bad_configuration_names_its_argument(kw, arg):
    with pytest.raises(ValueError, match=rf"^{arg} must"):
        tl.TailConfig("model.gguf", **kw)
    cfg = tl.TailConfig("model.gguf", scorers=["halves"], bits=[8])
    assert cfg.scorers == ("halves",) and cfg.bits == (8,) and cfg.prefix == 2048 - 128 - 1


def _rows(values: dict) -> list[dict]:
    """{(kind, method): [[nll per token] per doc]} -> rows."""
    return [{"kind": k, "doc": d, "method": m, "token": t, "nll": x}
            for (k, m), docs in values.items() for d, xs in enumerate(docs) for t, x in enumerate(xs)]


def _study(values: dict) -> tl.TailStudy:
    cfg = tl.TailConfig("model.gguf", kinds=("prose",), docs=2, length=64, tail=2, budget=8, scorers=("halves",
                        "minmax", "oracle"), int8_scorers=(), presses=("SnapKVPress", "KnormPress"), bits=(8, 2))
    lossless = [qs.Lossless("dense")] + [qs.Lossless(f"{s}@8", __import__("sparsekv").Router(s, token_budget=8), 8)
                                         for s in cfg.scorers]
    st = tl.TailStudy(cfg, "tiny", None, lossless, qs.peer_methods(cfg.presses, [8], cfg.prefix, cfg.bits),
                      rows=_rows(values))
    tl.summarize(st)
    return st


def test_each_method_is_paired_with_its_own_engine_s_dense_and_the_best_of_each_family_is_named():
    st = _study({("prose", "dense"): [[1.0, 2.0], [3.0, 1.0]], ("prose", "hf dense"): [[1.0, 2.0], [3.0, 1.5]],
                 ("prose", "halves@8"): [[1.5, 2.0], [3.0, 1.0]], ("prose", "minmax@8"): [[2.0, 2.0], [3.0, 1.0]],
                 ("prose", "oracle@8"): [[1.0, 2.0], [3.0, 1.0]],
                 ("prose", "SnapKV@8"): [[1.0, 2.0], [3.0, 2.5]], ("prose", "Knorm@8"): [[1.0, 3.0], [3.0, 2.5]],
                 ("prose", "hqq8"): [[1.0, 2.0], [3.0, 1.5]], ("prose", "hqq2"): [[4.0, 4.0], [4.0, 4.0]]})
    s = st.summary
    assert s[("prose", "halves@8")]["delta"] == pytest.approx(0.125)       # (0.5 + 0 + 0 + 0) / 4 over sparsekv dense
    assert s[("prose", "halves@8")]["docs_worse"] == 1 and s[("prose", "halves@8")]["docs"] == 2
    assert s[("prose", "SnapKV@8")]["delta"] == pytest.approx(0.25)        # (0 + 0 + 0 + 1) / 4 over transformers dense
    assert s[("prose", "hqq2")]["nll"] == pytest.approx(4.0)
    assert s[("prose", "dense")]["delta"] == 0 and s[("prose", "hf dense")]["delta"] == 0
    assert st.best_of("prose", "router") == "halves@8"                    # the oracle aside
    assert st.best_of("prose", "press") == "SnapKV@8" and st.best_of("prose", "quantiser") == "hqq8"
    b = st.best[("prose", "router vs press")]
    assert (b["a"], b["b"], b["n"]) == ("halves@8", "SnapKV@8", 4)
    assert b["mean"] == pytest.approx((0.5 + 0 + 0 - 1.5) / 4)           # raw losses, token by token
    assert st.agree["prose"]["mean"] == pytest.approx(-0.5 / 4)
    with pytest.raises(ValueError, match="what must be one of"):
        st.best_of("prose", "oracle")
    with pytest.raises(ValueError, match="no common token"):
        tl.paired_delta(st.rows, "code", "dense", "hqq8")


def test_the_checks_read_the_intervals_they_name():
    worse = {("prose", "dense"): [[1.0] * 2] * 2, ("prose", "hf dense"): [[1.0] * 2] * 2,
             ("prose", "halves@8"): [[1.1, 1.2], [1.1, 1.3]], ("prose", "minmax@8"): [[1.5, 1.6], [1.7, 1.5]],
             ("prose", "oracle@8"): [[1.0, 1.01], [1.0, 1.02]], ("prose", "SnapKV@8"): [[1.4, 1.5], [1.6, 1.5]],
             ("prose", "Knorm@8"): [[2.0, 2.0], [2.0, 2.0]], ("prose", "hqq8"): [[1.0, 1.01], [1.02, 1.0]],
             ("prose", "hqq2"): [[4.0, 4.1], [4.2, 4.0]]}
    st = _study(worse)
    st.nbytes = {m: {"read": 0.5, "held": 0.5} for m in st.methods}
    st.model_vs_held = {"hf dense": 1.0, "SnapKV@8": 1.004, "hqq8": 1.1}
    c = tail_report.checks(st, "t", min_docs=2)
    assert all(x.passed for x in c.values() if x.role != "hypothesis")
    verdicts = {k.split(":")[0]: x.passed for k, x in c.items() if x.role == "hypothesis"}
    assert verdicts == {"1. t prose": True, "2. t prose": True, "3. t prose": True}
    st.model_vs_held["SnapKV@8"] = 1.02
    assert not all(x.passed for x in tail_report.checks(st, "t", min_docs=2).values() if x.role == "invariant")
    assert not tail_report.checks(st, "t", min_docs=3)["t: documents per kind, at least 3"].passed
    rows = tail_report.table(st)
    assert {r["method"] for r in rows} == set(st.methods) and rows[0]["docs worse"] == "0/2"


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
