"""Layer 5: measuring the system: metrics, probes, sweeps, long-context probes on real text, agent
workloads and real chat traces.
"""
