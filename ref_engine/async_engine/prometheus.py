"""`PrometheusStatLogger`: the engine's outputs and scheduler stats as Prometheus metrics, under vLLM's
names (`vllm:` prefix, from vLLM's `vllm/v1/metrics/loggers.py`), so dashboards built for vLLM read ours.
Three more, under `serving_lab:`: `preempted_requests_total` counts preempted sequences rather than
preemption events (a request once, when it is first preempted), `num_requests_waiting_preempted` the
requests waiting to resume after a preemption, and `request_failures_total{reason,status}` the requests
the API server refused or failed (vLLM's `request_success_total` counts only those that finished).

Latencies come from each finished request's `RequestMetrics`, whose arrival is the API server's (the
middleware's stamp, carried to the core): TTFT and end-to-end latency include HTTP parsing, tokenization
and the hop to the core, as vLLM measures them. Token counters move with every streamed delta; a request's
prompt and prefix-cache counts are added with its first output (`AsyncLLM` says which output is first, so
this logger keeps nothing per request; of the scheduler's running preemption totals it keeps the last seen,
to count what is new). Each logger has its own registry, so two servers in one process
(tests) never share counters.

Lesson: lessons/06-architecture-map.md (what /metrics tells an operator).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core.metrics import LATENCY_BUCKETS
from ref_engine.engine_core.messages import EngineCoreOutputs
from ref_engine.outputs import RequestOutput

FINISH_REASONS = ("stop", "length", "abort", "error")  # CompletionOutput.finish_reason's values


class PrometheusStatLogger:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry).labels(model_name)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=self.registry).labels(model_name)

        self.num_requests_running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1).")
        self.num_preemptions = counter("vllm:num_preemptions", "Preemptions (events).")
        # not vLLM metrics: the seed's `preempted_sequences` counts sequences, not events
        self.preempted_requests = counter("serving_lab:preempted_requests",
                                          "Requests preempted at least once, counted when first preempted.")
        self.num_requests_waiting_preempted = gauge("serving_lab:num_requests_waiting_preempted",
                                                    "Requests waiting to resume after a preemption.")
        self.request_failures = Counter("serving_lab:request_failures",
                                        "Requests the API server refused or failed, by reason and HTTP status.",
                                        ["model_name", "reason", "status"], registry=self.registry)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of started requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prompt tokens the prefix cache served.")
        self.request_success = Counter("vllm:request_success", "Finished requests by finish reason.",
                                       ["model_name", "finished_reason"], registry=self.registry)
        for reason in FINISH_REASONS:  # exported at 0 from the start, so a rate() sees the first one
            self.request_success.labels(model_name, reason)
        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds", "Time to first token.")
        self.inter_token_latency = histogram("vllm:inter_token_latency_seconds", "Time between output tokens.")
        self.time_per_output_token = histogram("vllm:request_time_per_output_token_seconds",
                                               "Mean time per output token after the first, per request.")
        self.e2e_request_latency = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.")
        self.request_queue_time = histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled.")
        self._counted_preemptions = self._counted_preempted_reqs = 0  # the scheduler's totals counted so far

    def record_stats(self, outputs: EngineCoreOutputs) -> None:
        """The scheduler's gauges after a step, and its preemptions since the stats last came (the scheduler
        keeps running totals)."""
        stats = outputs.scheduler_stats
        if stats is not None:
            self.num_requests_running.set(stats.num_running_reqs)
            self.num_requests_waiting.set(stats.num_waiting_reqs)
            self.kv_cache_usage.set(stats.kv_cache_usage)
            self.num_preemptions.inc(stats.num_preemptions - self._counted_preemptions)
            self.preempted_requests.inc(stats.num_preempted_reqs - self._counted_preempted_reqs)
            self._counted_preemptions, self._counted_preempted_reqs = stats.num_preemptions, stats.num_preempted_reqs
            self.num_requests_waiting_preempted.set(stats.num_waiting_preempted_reqs)

    def record_abort(self) -> None:
        """The API server aborted a request (its client went away): no finished output will come."""
        self.request_success.labels(self.model_name, "abort").inc()

    def record_failure(self, reason: str, status: int) -> None:
        """The API server refused a request or failed it (`reason`: a short fixed word, never user input)."""
        self.request_failures.labels(self.model_name, reason, str(status)).inc()

    def record_output(self, output: RequestOutput, first: bool) -> None:
        """One streamed delta; `first`: the request's first output, which counts its prompt."""
        self.generation_tokens.inc(len(output.outputs[0].token_ids))
        if first:
            self.prompt_tokens.inc(len(output.prompt_token_ids))
            self.prefix_cache_queries.inc(len(output.prompt_token_ids))
            self.prefix_cache_hits.inc(output.num_cached_tokens)
        if not output.finished:
            return
        self.request_success.labels(self.model_name, output.outputs[0].finish_reason).inc()
        m = output.metrics
        if m is None or m.first_token_time is None or m.finished_time is None:
            return  # ended before its first token
        self.time_to_first_token.observe(m.first_token_time - m.arrival_time)
        self.e2e_request_latency.observe(m.finished_time - m.arrival_time)
        if m.first_scheduled_time is not None:
            self.request_queue_time.observe(m.first_scheduled_time - m.arrival_time)
        for before, after in zip(m.token_times, m.token_times[1:]):
            self.inter_token_latency.observe(after - before)
        if len(m.token_times) > 1:
            self.time_per_output_token.observe((m.token_times[-1] - m.token_times[0]) / (len(m.token_times) - 1))
