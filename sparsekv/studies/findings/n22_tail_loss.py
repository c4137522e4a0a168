"""Notebook 22's finding (`notebooks/22_tail_loss.ipynb`): tail loss on real text, every family against its own dense.
`tail_finding` words any run of the tail-loss harness (archived notebook 23 is its Gemma run)."""
from ...methods import best
from .finding import PRESSES, Finding, Metrics, router_names

N22 = "22_tail_loss"                                    # tail loss of every family: SmolLM2 at 2k


def _tail_delta(n: str, tag: str, kind: str, method: str):
    """A method's excess loss over its own engine's dense on `kind` in notebook `n`, with its paired interval."""
    def f(m: Metrics) -> str:
        k = f"loss.{tag}.{kind}.{method}"
        return f"{m[n][k + '.delta']:+.3f} [{m[n][k + '.ci_lo']:+.3f}, {m[n][k + '.ci_hi']:+.3f}]"
    return f


def _tail_best(m: Metrics, n: str, tag: str, kind: str, family: str) -> str:
    """The best of a family by mean loss, by the studies' own rule (`methods.best`, as `TailStudy.best_of`)."""
    nll = {k.split(".")[3]: v for k, v in m[n].items() if k.startswith(f"loss.{tag}.{kind}.") and k.endswith(".nll")}
    names = {"router": [x for x in nll if x.split("@")[0] in router_names() and "@" in x],
             "press": [x for x in nll if x.split("@")[0] in PRESSES],
             "quantiser": [x for x in nll if x.startswith("hqq")]}[family]
    return best({x: nll[x] for x in names}, higher=False)


def _tail_pair(n: str, tag: str, kind: str, family: str):
    """The best router against the best press or quantised cache on `kind`, paired per token, in words."""
    def f(m: Metrics) -> str:
        r, o = _tail_best(m, n, tag, kind, "router"), _tail_best(m, n, tag, kind, family)
        k = f"best.{tag}.{kind}.router_vs_{family}"
        d, lo, hi = m[n][k], m[n][k + ".ci_lo"], m[n][k + ".ci_hi"]
        says = ("the router's loss is lower" if hi < 0 else "the router's loss is higher" if lo > 0 else
                "no significant difference")
        return f"`{r}` against {o}, {d:+.3f} nats per token [{lo:+.3f}, {hi:+.3f}]: {says}"
    return f


def tail_finding(n: str, tag: str, model: str, scope: str) -> Finding:
    kinds = ("prose", "code")
    return Finding(
        "**Tail loss on real text, every family against its own dense (notebook " + n[:2] + ", " + model + " at "
        "{L:,.0f} tokens).** The next-token loss on the last {T:.0f} tokens of {D:.0f} documents per kind" + scope +
        ", each method minus its own engine's dense per token, with a paired per-token bootstrap 95% interval (nats): "
        "on prose, `halves@256` {hp}, `minmax@256` {mp}, the oracle {op}, `halves@256` over int8 blocks {ip}, the best "
        "press {bpn} {bp}, HQQ 8-bit {q8p}, 4-bit {q4p} and 2-bit {q2p}; on code, `halves@256` {hc}, `minmax@256` {mc}, "
        "the oracle {oc}, over int8 blocks {ic}, the best press {bcn} {bc}, HQQ 8-bit {q8c}, 4-bit {q4c} and 2-bit "
        "{q2c}. The best router against the best press, on the same tokens: prose {rpp}; code {rpc}. Against the best "
        "quantised cache: prose {rqp}; code {rqc}. Per decode step `halves@256` reads {hr:.2f} of a bf16 dense cache "
        "and holds {hh:.2f}, over int8 blocks {ir:.2f} and {ih:.2f}; a press reads and holds {pr:.2f}; HQQ 8-bit "
        "{q8r:.2f}.",
        {"L": (n, f"length.{tag}"), "T": (n, f"tail.{tag}"), "D": (n, f"docs.{tag}"),
         **{f"{a}{k[0]}": _tail_delta(n, tag, k, meth) for k in kinds for a, meth in (
             ("h", "halves@256"), ("m", "minmax@256"), ("o", "oracle@256"), ("i", "int8 halves@256"),
             ("q8", "hqq8"), ("q4", "hqq4"), ("q2", "hqq2"))},
         **{f"b{k[0]}n": (lambda kk: lambda m: _tail_best(m, n, tag, kk, "press"))(k) for k in kinds},
         **{f"b{k[0]}": (lambda kk: lambda m: _tail_delta(n, tag, kk, _tail_best(m, n, tag, kk, "press"))(m))(k)
            for k in kinds},
         "rpp": _tail_pair(n, tag, "prose", "press"), "rpc": _tail_pair(n, tag, "code", "press"),
         "rqp": _tail_pair(n, tag, "prose", "quantiser"), "rqc": _tail_pair(n, tag, "code", "quantiser"),
         "hr": (n, f"bytes.{tag}.halves@256.read"), "hh": (n, f"bytes.{tag}.halves@256.held"),
         "ir": (n, f"bytes.{tag}.int8 halves@256.read"), "ih": (n, f"bytes.{tag}.int8 halves@256.held"),
         "pr": (n, f"bytes.{tag}.SnapKV@256.read"), "q8r": (n, f"bytes.{tag}.hqq8.read")})


FINDINGS = (tail_finding(N22, "smollm2_2k", "SmolLM2-135M", ""),)
