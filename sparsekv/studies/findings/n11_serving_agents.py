"""Notebook 11's finding (`notebooks/11_serving_agents.ipynb`): serving many agents, measured on the CPU and
simulated on H200s."""
from .finding import Finding

N11 = "11_serving_agents"


def _ms(key: str):
    return lambda m: 1e3 * m[N11][key]


FINDINGS = (
    Finding("**Serving many agents (notebook 11).** {n:.0f} agent requests on SmolLM2 on this CPU: every request got the "
            "tokens it gets alone under all five policies, dense and routed. With chunked prefill (dense) the prefix cache "
            "served {hr:.0%} of prompt tokens under sharing; p90 TTFT was {ts:.1f} s under static batches, {tc:.1f} s under "
            "continuous batching and {tk:.1f} s chunked, and the p99 inter-token gap {gc:.0f} ms continuous against "
            "{gk:.0f} ms chunked. The simulator, fitted on the chunked runs only, predicts the other runs' TTFT and TPOT "
            "percentiles with a median error of {e:.0%} (worst {w:.0%}) and serves {sr:,.0f} requests in {st:.1f} s. "
            "Simulated on an H200 roofline with {ga:.0f} agents at {gc2:,.0f} tokens: prefix sharing cuts the median TTFT "
            "{x:.1f}x; chunked against continuous batching gives a p50 TTFT of {a:.0f} against {b:.0f} ms and a p99 "
            "inter-token gap of {c:.1f} against {d:.1f} ms with shared prefixes, and {e2:.1f} against {f:.1f} ms with "
            "none. On two H200s, separating prefill from decode (one device each, K/V over a 50 GB/s link) against two "
            "colocated replicas: p99 inter-token gap {sg:.1f} against {cg:.1f} ms and p50 TTFT {st2:.0f} against {ct:.0f} ms "
            "with shared prefixes. At 1M tokens, with every block's routing summaries charged (read each step and held in "
            "HBM), routing makes a decode step {r:.0f}x cheaper, and the summaries are {ss:.0%} of what a routed step reads; "
            "the lossless store fits {bd:.0f} such sequences in HBM, and {bt:.0f} when a cold tier holds the blocks a "
            "step does not read.",
            {"n": (N11, "requests"), "hr": (N11, "chunked.dense.hit_rate"), "ts": (N11, "fcfs_static.dense.ttft_p90_s"),
             "tc": (N11, "continuous.dense.ttft_p90_s"), "tk": (N11, "chunked.dense.ttft_p90_s"),
             "gc": _ms("continuous.dense.itl_p99_s"), "gk": _ms("chunked.dense.itl_p99_s"),
             "e": (N11, "sim.median_rel_error"), "w": (N11, "sim.max_rel_error"),
             "sr": (N11, "sim.scale_requests"), "st": (N11, "sim.scale_seconds"), "ga": (N11, "gpu.agents"),
             "x": lambda m: m[N11]["gpu.sim.private.chunked.ttft_p50_s"] / m[N11]["gpu.sim.shared.chunked.ttft_p50_s"],
             "a": _ms("gpu.sim.shared.chunked.ttft_p50_s"), "b": _ms("gpu.sim.shared.continuous.ttft_p50_s"),
             "c": _ms("gpu.sim.shared.chunked.itl_p99_s"), "d": _ms("gpu.sim.shared.continuous.itl_p99_s"),
             "e2": _ms("gpu.sim.private.chunked.itl_p99_s"), "f": _ms("gpu.sim.private.continuous.itl_p99_s"),
             "r": lambda m: m[N11]["gpu.ctx1048576.decode_ms_dense"] / m[N11]["gpu.ctx1048576.decode_ms_routed"],
             "bd": (N11, "gpu.ctx1048576.max_batch_dense"), "gc2": (N11, "gpu.sim_context"),
             "bt": (N11, "gpu.ctx1048576.max_batch_tiered"), "ss": (N11, "gpu.ctx1048576.summary_share_routed"),
             "sg": _ms("gpu.separated.shared.itl_p99_s"), "cg": _ms("gpu.colocated.shared.itl_p99_s"),
             "st2": _ms("gpu.separated.shared.ttft_p50_s"), "ct": _ms("gpu.colocated.shared.ttft_p50_s")}),
)
