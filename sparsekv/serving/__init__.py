"""Layer 6 (the top of the runtime): serving many requests at once over one `Engine`. Workload traces and traces
with arrival times, scheduling policies, a scheduler that drives either the real engine or a calibrated cost model
(the simulator), and the measurements notebook 11 reports (TTFT, TPOT, throughput, pool occupancy, prefix hits).
Like every runtime layer, it never imports the research side (analysis, recall, studies, suite).

    requests = trace.with_arrivals(workloads.multi_agent_build(...), rate_per_s=2.0)
    result = Scheduler(EngineExecutor(engine, router), SchedulerConfig(policy="chunked")).run(requests)
"""
