"""Notebook 22's finding (`notebooks/22_tail_loss.ipynb`): tail loss on real text, every family against its own dense,
documents as the unit and the declared contrasts Holm-adjusted (`tail_loss.plan`). `tail_finding` words a run of the
tail-loss harness before 2026-12-05 (intervals over tokens, "the best" router and press picked on the losses): the
archived notebook 23's committed metrics, kept for comparison until a rerun replaces them."""
from ...methods import best
from ..findings.finding import PRESSES, Finding, Metrics, router_names

N22 = "22_tail_loss"                                    # tail loss of every family: SmolLM2 and Gemma 3 at 2k


def _tail_delta(n: str, tag: str, kind: str, method: str):
    """A method's excess loss over its own engine's dense on `kind` in notebook `n`, with its paired interval (over
    tokens before 2026-12-05, over documents since)."""
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


def _holm(m: Metrics, n: str, key: str, margin: str | None = None) -> str:
    """A declared contrast's words from its recorded decision (`.outcome`: `clustered.outcome` on the Holm p, the
    decision `clustered.verdict` words): "lower"/"higher" or "no difference shown"; with `margin`, non-inferiority's."""
    est, p, decided = m[n][key], m[n][key + ".p_holm"], m[n][key + ".outcome"]
    said = f"{est:+.3f} [{m[n][key + '.ci_lo']:+.3f}, {m[n][key + '.ci_hi']:+.3f}], Holm p = {p:.2g}"
    if margin is not None:
        return f"{'non-inferior' if decided else 'not shown non-inferior'} within {margin} ({said})"
    return f"{('lower' if decided < 0 else 'higher') if decided else 'no difference shown'} ({said})"


def _presses(m: Metrics, n: str, tag: str, kind: str, budget: int = 256) -> list[str]:
    return sorted(p for p in PRESSES if f"loss.{tag}.{kind}.{p}@{budget}.delta" in m[n])


def _press_range(n: str, tag: str, kind: str):
    """Every press's excess loss on `kind`: the full range, lowest to highest, each named."""
    def f(m: Metrics) -> str:
        d = sorted((m[n][f"loss.{tag}.{kind}.{p}@256.delta"], p) for p in _presses(m, n, tag, kind))
        return f"from {d[0][0]:+.3f} ({d[0][1]}) to {d[-1][0]:+.3f} ({d[-1][1]})"
    return f


def _router_vs_presses(n: str, tag: str, kind: str):
    """The named router's declared contrasts with every press on `kind`: how many lower, higher, undecided."""
    def f(m: Metrics) -> str:
        keys = [f"contrast.{tag}.{kind}.halves@256_vs_{p}@256" for p in _presses(m, n, tag, kind)]
        ps = [(m[n][k], m[n][k + ".outcome"]) for k in keys]
        lower = sum(o < 0 for _, o in ps)                # the recorded decisions, as tail_loss.report counts them
        higher = sum(o > 0 for _, o in ps)
        est = sorted(e for e, _ in ps)
        return (f"lower than {lower} of {len(ps)} presses, higher than {higher}, no difference shown against "
                f"{len(ps) - lower - higher} (estimates {est[0]:+.3f} to {est[-1]:+.3f})")
    return f


def contrast_finding(n: str, tag: str, model: str) -> Finding:
    kinds = ("prose", "code")
    c = f"contrast.{tag}"
    return Finding(
        "**Tail loss on real text, every family against its own dense (notebook " + n[:2] + ", " + model + " at "
        "{L:,.0f} tokens).** The next-token loss on the last {T:.0f} tokens of {D:.0f} documents per kind, each method "
        "minus its own engine's dense, with a 95% interval over documents (nats per token): on prose, `halves@256` "
        "{hp}, `minmax@256` {mp}, the oracle {op}, `halves@256` over int8 blocks {ip}, HQQ 8-bit {q8p}, 4-bit {q4p} "
        "and 2-bit {q2p}, the presses {pp}; on code, `halves@256` {hc}, `minmax@256` {mc}, the oracle {oc}, over int8 "
        "blocks {ic}, HQQ 8-bit {q8c}, 4-bit {q4c} and 2-bit {q2c}, the presses {pc}. Contrasts declared before the "
        "run, one Holm family: `halves@256` (named in advance, not picked on these losses) on prose is {rpp}, on code "
        "{rpc}; against HQQ 8-bit on prose {rqp}, on code {rqc}; over int8 blocks against exact ones on prose {nip}, "
        "on code {nic}. Per decode step `halves@256` reads {hr:.2f} of a bf16 dense cache and holds {hh:.2f}, over "
        "int8 blocks {ir:.2f} and {ih:.2f}; a press reads and holds {pr:.2f}; HQQ 8-bit {q8r:.2f}.",
        {"L": (n, f"length.{tag}"), "T": (n, f"tail.{tag}"), "D": (n, f"docs.{tag}"),
         **{f"{a}{k[0]}": _tail_delta(n, tag, k, meth) for k in kinds for a, meth in (
             ("h", "halves@256"), ("m", "minmax@256"), ("o", "oracle@256"), ("i", "int8 halves@256"),
             ("q8", "hqq8"), ("q4", "hqq4"), ("q2", "hqq2"))},
         **{f"p{k[0]}": _press_range(n, tag, k) for k in kinds},
         **{f"rp{k[0]}": _router_vs_presses(n, tag, k) for k in kinds},
         **{f"rq{k[0]}": (lambda kk: lambda m: _holm(m, n, f"{c}.{kk}.halves@256_vs_hqq8"))(k) for k in kinds},
         **{f"ni{k[0]}": (lambda kk: lambda m: _holm(m, n, f"{c}.{kk}.int8_halves@256_no_worse_than_halves@256",
                                                     f"{m[n][f'margin.{tag}']:g} nats"))(k) for k in kinds},
         "hr": (n, f"bytes.{tag}.halves@256.read"), "hh": (n, f"bytes.{tag}.halves@256.held"),
         "ir": (n, f"bytes.{tag}.int8 halves@256.read"), "ih": (n, f"bytes.{tag}.int8 halves@256.held"),
         "pr": (n, f"bytes.{tag}.SnapKV@256.read"), "q8r": (n, f"bytes.{tag}.hqq8.read")})


FINDINGS = (contrast_finding(N22, "smollm2_2k", "SmolLM2-135M"), contrast_finding(N22, "gemma3_2k", "Gemma 3 270M"))
