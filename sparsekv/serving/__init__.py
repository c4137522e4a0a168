"""Serving many requests at once over one `Engine`: traces with arrival times, scheduling policies, a
scheduler that drives either the real engine or a calibrated cost model (the simulator), and the
measurements notebook 11 reports (TTFT, TPOT, throughput, pool occupancy, prefix hits).

    requests = trace.with_arrivals(workloads.multi_agent_build(...), rate_per_s=2.0)
    result = Scheduler(EngineExecutor(engine, router), SchedulerConfig(policy="chunked")).run(requests)
"""
