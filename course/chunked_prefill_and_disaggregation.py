"""Lesson 3: the scheduler. The prefill stall, the token-budget dial, capacity under an ITL SLO, fairness
between tenants, colocated vs disaggregated serving on a simulated GPU cluster, and a real 1P+1D pair.

- `prefill_stall`: a few requests are decoding when one long prompt arrives. Unchunked, its whole prefill
  is one step and every running decode waits for it (Sarathi-Serve, OSDI'24, Fig 1a); chunked under a
  token budget, the decodes keep getting a token every step. Rows per budget and side with the decodes'
  median and largest inter-token gap and the long prompt's TTFT; `timelines` gives the per-token times.
- `budget_dial`: TTFT against ITL (p50, p99) over token budgets, on both sides; arrivals all at once, so
  the step composition is decided by the core alone and identical on both sides. Rows say how many steps
  handed out first tokens, and how far the simulator priced the steps with prompt tokens, and the
  decode-only ones, from the measured time of the same steps: where a TTFT error comes from.
- `capacity_vs_budget`: simulated only, a GPU profile: the highest Poisson rate that keeps p99 ITL within
  an SLO and the median queueing delay under a bound (Sarathi-Serve's definition of capacity), per budget.
- `tenant_fairness`: a flooding tenant and a light one under "fcfs", "priority" and "fair"; per-tenant
  service over time (`service_curves`), the light tenant's TTFT, Jain's index, throughput.
- `colocated_vs_disaggregated`: simulated `Cluster` goodput under TTFT and TPOT SLOs (DistServe, OSDI'24),
  for colocated replicas (one arm per configuration: without chunked prefill, and with it under a token
  budget) and xP+yD on the same number of GPUs, over a rate sweep; `kv_link_sweep` sweeps the KV link.
- `colocated_vs_simulated`: the colocated arm on this machine, engine and simulator side by side: token
  prompts at once on one engine with chunked prefill under a token budget, the baseline for the next.
- `disaggregation_vs_simulated`: the same token prompts served through `DisaggregatedLLM` (a prefill and a
  decode engine process, the shared-memory KV connector); the KV link of that very run is fitted
  (`KVLink.fit`: seconds = latency + bytes / bandwidth over its requests), then the same workload is simulated on a
  `Cluster` with one prefill and one decode replica joined by that link. The rows compare mean TTFT and
  ITL, beside the measured prefill / transfer / decode split. The fitted link is this machine's shared
  memory plus the router's relay of a small message, so it is fast next to a real network; the simulated
  TTFT then hinges on the step times the profile predicts, which a busy machine stretches. Each engine
  runs one torch thread, so a profile calibrated with more threads prices its steps too fast: price the
  pair with `serving_lab.calibrate.load_or_calibrate(model, threads=1)`.

Rows are plain dicts, as `serving_lab.pairing` makes them (side "measured" | "simulated", `*_err_pct` on
simulated rows). `pd_layout` draws the two layouts; `demo` is `serving-lab demo scheduler`.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#the-stall,
lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, linear_regression, median, quantiles
from typing import Any

from core.config import EngineConfig
from core.metrics import RunMetrics, relative_error
from core.workload import Workload, WorkloadRequest
from course.demo import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from course.drawing import COLORS, arrow, box, canvas
from serving_lab.pairing import Job, Sides, paired_rows, same_policy
from sim.cluster import Cluster
from sim.hardware import dtype_bytes

UNCHUNKED = None  # the budget label of a run without chunked prefill


def _budget_config(budget: int | None, longest_prompt: int, **knobs: Any) -> EngineConfig:
    """`budget` tokens per step with chunked prefill; None: no chunking, `max_model_len` = the budget =
    the longest prompt plus 512 (vLLM without chunked prefill needs a budget of at least max_model_len)."""
    if budget is None:
        length = longest_prompt + 512
        return EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=length, max_model_len=length,
                            **knobs)
    return EngineConfig(max_num_batched_tokens=budget, **knobs)


def _gaps(metrics: RunMetrics, ids: Iterable[str]) -> list[float]:
    wanted = set(ids)
    return [b - a for r in metrics.requests if r.request_id in wanted
            for a, b in zip(r.token_times, r.token_times[1:])]


def stall_workload(num_decodes: int = 4, decode_prompt_len: int = 32, decode_output_len: int = 48,
                   long_prompt_len: int = 512, long_arrival_s: float = 0.2) -> Workload:
    """`num_decodes` short requests at time 0 (ids "0".."n-1"), then one long prompt (the last id) at
    `long_arrival_s`, while they decode."""
    short = tuple(WorkloadRequest(0.0, decode_prompt_len, decode_output_len) for _ in range(num_decodes))
    long = WorkloadRequest(long_arrival_s, long_prompt_len, 4)
    return Workload(short + (long,), seed=0, name="stall")


def prefill_stall(budgets: Sequence[int | None], sides: Sides, *, num_decodes: int = 4,
                  decode_prompt_len: int = 32, decode_output_len: int = 48, long_prompt_len: int = 512,
                  arrival_after_steps: int = 8) -> list[dict[str, Any]]:
    """The stall: decodes running when a long prompt arrives, for each budget (None: unchunked).

    The long prompt arrives when, by the simulator's clock, the decodes have had `arrival_after_steps`
    steps; on the engine that is wall-clock time, so the step it joins may differ by one or two between
    the sides (the arrival depends on timing) and the times, not the step counts, are compared. Rows add
    `decode_p50_itl_ms`, `decode_p99_itl_ms` (linear interpolation, as `RunMetrics`), `decode_max_itl_ms`
    (the stall), `long_ttft_ms` and `max_step_tokens`, with `*_err_pct` on simulated rows; `metrics` holds
    the `RunMetrics` for `timelines`."""
    probe = stall_workload(num_decodes, decode_prompt_len, decode_output_len, long_prompt_len, 1e9)
    probe_run = sides.simulator(_budget_config(256, long_prompt_len)).run(probe)
    arrival = probe_run.steps[min(arrival_after_steps, len(probe_run.steps) - 1)].start
    workload = stall_workload(num_decodes, decode_prompt_len, decode_output_len, long_prompt_len, arrival)
    jobs = [Job(workload, _budget_config(b, long_prompt_len), {"budget": b if b is not None else "unchunked"})
            for b in budgets]
    rows = paired_rows(jobs, sides)
    decode_ids = [str(i) for i in range(num_decodes)]
    long_id = str(num_decodes)
    measured: dict[Any, dict[str, Any]] = {}
    for row in rows:
        m: RunMetrics = row["metrics"]
        gaps = _gaps(m, decode_ids)
        long = next(r for r in m.requests if r.request_id == long_id)
        row.update(long_arrival_s=arrival, decode_p50_itl_ms=1000 * median(gaps),
                   decode_p99_itl_ms=1000 * quantiles(gaps, n=100, method="inclusive")[98],
                   decode_max_itl_ms=1000 * max(gaps), long_ttft_ms=1000 * long.ttft,
                   max_step_tokens=max(s.num_tokens for s in m.steps))
        if row["side"] == "measured":
            measured[row["budget"]] = row
        elif row["budget"] in measured:
            for key in ("decode_p50_itl_ms", "decode_p99_itl_ms", "decode_max_itl_ms", "long_ttft_ms"):
                row[f"{key}_err_pct"] = relative_error(row[key], measured[row["budget"]][key])
    return rows


def timelines(metrics: RunMetrics) -> dict[str, tuple[float, ...]]:
    """Each request's output-token times (seconds on the run's clock), by request id."""
    return {r.request_id: r.token_times for r in metrics.requests}


def budget_dial(budgets: Sequence[int], sides: Sides, *, num_requests: int = 6, prompt_len: int = 192,
                output_len: int = 16, seed: int = 0) -> list[dict[str, Any]]:
    """TTFT against ITL over token budgets: `num_requests` prompts arriving at once, `max_num_batched_tokens`
    = budget with chunked prefill. A small budget interleaves small prompt chunks with the decodes (smooth
    ITL, late first tokens); a big one prefills several prompts in one long step that the decodes already
    running wait for (early first tokens, an ITL spike). All arrive at time 0, so the core decides the very
    same steps on both sides: simulated rows carry `same_policy`.

    Rows add `max_step_tokens` and `first_token_steps` (how many distinct steps produced the prompts' first
    tokens: a big budget finishes several prompts in one step, so they share one first-token time), and on
    simulated rows, beside the `*_err_pct` of the latency columns, `prefill_steps_err_pct` and
    `decode_steps_err_pct`: the simulated time of the steps that carry prompt tokens, and of the decode-only
    steps, against the measured time of the very same steps. They say where a TTFT error comes from."""
    workload = Workload.synthetic(num_requests, prompt_len, output_len, seed=seed, name="dial")
    jobs = [Job(workload, EngineConfig(max_num_batched_tokens=b), {"budget": b}) for b in budgets]
    rows = paired_rows(jobs, sides)
    previous: dict[str, Any] | None = None
    for row in rows:
        m: RunMetrics = row["metrics"]
        row.update(max_step_tokens=max(s.num_tokens for s in m.steps),
                   first_token_steps=len({r.first_token_time for r in m.requests}))
        if row["side"] == "measured":
            previous = row
            continue
        if previous is not None and previous["budget"] == row["budget"]:
            row["same_policy"] = same_policy(previous["metrics"], m)
            for key in ("p99_itl_ms", "median_itl_ms", "p99_ttft_ms"):
                row[f"{key}_err_pct"] = relative_error(row[key], previous[key])
            if row["same_policy"]:
                row.update(_step_errors(previous["metrics"], m))
    return rows


def _step_errors(measured: RunMetrics, simulated: RunMetrics) -> dict[str, float]:
    """The simulated time of the steps with prompt tokens and of the decode-only steps, each summed, against
    the measured time of the same steps (the runs made the same steps: `same_policy`)."""
    sums = {"prefill": [0.0, 0.0], "decode": [0.0, 0.0]}
    for ms, ss in zip(measured.steps, simulated.steps):
        kind = "prefill" if max(ms.query_lens) > 1 else "decode"
        sums[kind][0] += ms.duration
        sums[kind][1] += ss.duration
    return {f"{kind}_steps_err_pct": relative_error(sim, meas)
            for kind, (meas, sim) in sums.items() if meas > 0}


def capacity_vs_budget(budgets: Sequence[int | None], sides: Sides, rates: Sequence[float], *,
                       itl_slo_ms: float, max_median_queue_ms: float = 2000.0, num_requests: int = 150,
                       prompt_len: Any = (256, 2048), output_len: Any = (64, 256), seed: int = 0
                       ) -> list[dict[str, Any]]:
    """Simulated: for each budget (None: unchunked) and Poisson rate, p99 ITL, median queueing delay and
    whether the run meets the SLO (p99 ITL <= `itl_slo_ms` and median queue <= `max_median_queue_ms`, as
    Sarathi-Serve defines capacity). `capacity` per budget is the highest rate that meets it (0 if none)
    with every lower rate also meeting it."""
    longest = prompt_len[1] if isinstance(prompt_len, tuple) else int(prompt_len)
    rows = []
    for budget in budgets:
        config = _budget_config(budget, longest, max_num_seqs=256)
        simulator = sides.simulator(config)
        ok_so_far, capacity = True, 0.0
        points = []
        for rate in sorted(rates):
            workload = Workload.synthetic(num_requests, prompt_len, output_len, arrival=rate, seed=seed)
            m = simulator.run(workload)
            queue = median(r.first_scheduled_time - r.arrival_time for r in m.requests if r.finished)
            meets = m.p99_itl_ms <= itl_slo_ms and 1000 * queue <= max_median_queue_ms and m.failed == 0
            ok_so_far = ok_so_far and meets
            if ok_so_far:
                capacity = rate
            points.append({"budget": budget if budget is not None else "unchunked", "rate": rate,
                           "p99_itl_ms": m.p99_itl_ms, "median_queue_ms": 1000 * queue,
                           "p99_ttft_ms": m.p99_ttft_ms, "output_throughput": m.output_throughput,
                           "meets_slo": meets})
        rows += [{**p, "capacity": capacity} for p in points]
    return rows


def fairness_workload(heavy: int = 16, light: int = 4, prompt_len: int = 64, output_len: int = 16,
                      heavy_first: bool = True) -> Workload:
    """Tenant "heavy" floods `heavy` requests, tenant "light" sends `light`; all arrive at time 0, the
    heavy tenant's first in the queue (priority: heavy 1, light 0, so "priority" serves light first)."""
    flood = Workload.synthetic(heavy, prompt_len, output_len, seed=1, name="heavy").with_tenant("heavy")
    flood = flood.with_priority(1)
    trickle = Workload.synthetic(light, prompt_len, output_len, seed=2, name="light").with_tenant("light")
    return flood + trickle if heavy_first else trickle + flood


def tenant_fairness(policies: Sequence[str], sides: Sides, *, workload: Workload | None = None,
                    max_num_seqs: int = 4, tenant_weights: dict[str, float] | None = None,
                    max_num_batched_tokens: int = 256) -> list[dict[str, Any]]:
    """The same two-tenant workload under each scheduling policy. Rows add `light_mean_ttft_ms`,
    `heavy_mean_ttft_ms`, `jain` (Jain's index of the weighted service, over the time both tenants had
    completed requests) and, on simulated rows with a measured twin, `same_policy` (arrivals all at once:
    the core's decisions are identical on both sides)."""
    workload = workload or fairness_workload()
    weights = tuple(sorted(tenant_weights.items())) if tenant_weights else None
    jobs = [Job(workload, EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                       scheduling_policy=p, tenant_weights=weights if p == "fair" else None),
                {"policy": p}) for p in policies]
    rows = paired_rows(jobs, sides)
    previous: dict[str, Any] | None = None
    for row in rows:
        m: RunMetrics = row["metrics"]
        row.update({f"{t}_mean_ttft_ms": s.mean_ttft_ms for t, s in m.per_tenant.items()},
                   jain=m.jain_fairness(tenant_weights))
        if row["side"] == "measured":
            previous = row
        elif previous is not None and previous["policy"] == row["policy"]:
            row["same_policy"] = same_policy(previous["metrics"], row["metrics"])
    return rows


def service_curves(metrics: RunMetrics, points: int = 50) -> dict[str, list[tuple[float, int]]]:
    """Per tenant, (time, tokens served by then): prompt tokens once the first token is out, plus output
    tokens (`RequestRecord.tokens_served_by`), at `points` times over the run."""
    end = max(r.finish_time for r in metrics.requests if r.finished)
    times = [end * i / (points - 1) for i in range(points)]
    tenants = sorted({r.tenant or "default" for r in metrics.requests})
    return {t: [(x, sum(r.tokens_served_by(x) for r in metrics.requests if (r.tenant or "default") == t))
                for x in times] for t in tenants}


def weighted_service_ratio(metrics: RunMetrics, a: str, b: str) -> float:
    """Tokens served to tenant `b` over tokens served to `a`, at the moment the first of the two tenants
    finished its last request (while both were backlogged, up to the end of the shorter one)."""
    until = min(s.last_finish_time for t, s in metrics.per_tenant.items() if t in (a, b))
    served = {t: sum(r.tokens_served_by(until) for r in metrics.requests if (r.tenant or "default") == t)
              for t in (a, b)}
    return served[b] / served[a]


def colocated_vs_disaggregated(sides: Sides, rates: Sequence[float], *,
                               colocated: Mapping[str, EngineConfig] | None = None,
                               layouts: Sequence[tuple[int, int]] = ((1, 1),), num_gpus: int = 2,
                               ttft_slo_ms: float = 400.0, tpot_slo_ms: float = 40.0, num_requests: int = 200,
                               prompt_len: Any = 512, output_len: Any = 64,
                               kv_link_bandwidth: float | None = None, config: EngineConfig | None = None,
                               seed: int = 0) -> list[dict[str, Any]]:
    """Simulated: `num_gpus` colocated replicas for each named configuration in `colocated` (default: one arm,
    "colocated", running `config`), against each (x prefill, y decode) layout whose replicas run `config`,
    at each Poisson rate. The colocated arms are the baselines worth comparing: without chunked prefill (what
    DistServe compared against) and with it under a token budget (what a colocated deployment runs today).
    Rows: layout, rate, gpus, goodput (requests/s completed within both SLOs, DistServe's definition),
    `goodput_per_gpu`, SLO attainment, p90 TTFT, mean TPOT, p99 ITL and output throughput. DistServe's
    Fig 1 workload is 512-token prompts and 64-token outputs."""
    config = config or EngineConfig(max_num_batched_tokens=2048, max_num_seqs=256)
    colocated = colocated or {"colocated": config}
    rows = []
    for rate in rates:
        workload = Workload.synthetic(num_requests, prompt_len, output_len, arrival=rate, seed=seed)
        setups = [(name, num_gpus, Cluster(sides.simulated_arch(), sides.hardware, arm, num_replicas=num_gpus,
                                           router="least_loaded", dtype=sides.dtype))
                  for name, arm in colocated.items()]
        setups += [(f"{x}P+{y}D", x + y, Cluster(sides.simulated_arch(), sides.hardware, config,
                                                 num_prefill_replicas=x, num_decode_replicas=y,
                                                 router="least_loaded", kv_link_bandwidth=kv_link_bandwidth,
                                                 dtype=sides.dtype))
                   for x, y in layouts]
        for name, gpus, cluster in setups:
            m = cluster.run(workload)
            goodput = m.goodput(ttft_slo_ms, tpot_slo_ms)
            rows.append({"layout": name, "rate": rate, "gpus": gpus, "goodput": goodput,
                         "goodput_per_gpu": goodput / gpus,
                         "slo_attainment": m.slo_attainment(ttft_slo_ms, tpot_slo_ms),
                         "p90_ttft_ms": m.p90_ttft_ms, "mean_tpot_ms": m.mean_tpot_ms,
                         "p99_itl_ms": m.p99_itl_ms, "output_throughput": m.output_throughput})
    return rows


def max_rate_within(rows: Iterable[dict[str, Any]], layout: str, attainment: float = 0.9) -> float:
    """The highest rate at which `layout` kept `attainment` of requests within both SLOs, with every
    lower rate also keeping it (DistServe's per-GPU goodput reads off the same curve); 0 if none."""
    best = 0.0
    for row in sorted((r for r in rows if r["layout"] == layout), key=lambda r: r["rate"]):
        if row["slo_attainment"] < attainment:
            break
        best = row["rate"]
    return best


def kv_link_sweep(sides: Sides, bandwidths: dict[str, float], *, rate: float, prompt_len: int = 512,
                  output_len: int = 64, num_requests: int = 200, ttft_slo_ms: float = 400.0,
                  tpot_slo_ms: float = 40.0, config: EngineConfig | None = None, seed: int = 0
                  ) -> list[dict[str, Any]]:
    """Simulated 1P+1D at one rate, with the KV link swept (name -> bytes/s): the transfer time of one
    prompt (`CostModel.kv_transfer_time`), mean and p90 TTFT, SLO attainment and goodput."""
    config = config or EngineConfig(max_num_batched_tokens=2048, max_num_seqs=256)
    workload = Workload.synthetic(num_requests, prompt_len, output_len, arrival=rate, seed=seed)
    rows = []
    for name, bandwidth in bandwidths.items():
        cluster = Cluster(sides.simulated_arch(), sides.hardware, config, num_prefill_replicas=1,
                          num_decode_replicas=1, kv_link_bandwidth=bandwidth, dtype=sides.dtype)
        transfer = cluster.simulator.cost_model.kv_transfer_time(prompt_len)
        m = cluster.run(workload)
        rows.append({"link": name, "gb_per_s": bandwidth / 1e9, "transfer_ms": 1000 * transfer,
                     "mean_ttft_ms": m.mean_ttft_ms, "p90_ttft_ms": m.p90_ttft_ms,
                     "slo_attainment": m.slo_attainment(ttft_slo_ms, tpot_slo_ms),
                     "goodput": m.goodput(ttft_slo_ms, tpot_slo_ms)})
    return rows


# ---- a real 1P+1D pair ----


@dataclass(frozen=True)
class KVLink:
    """A KV link as the simulator's `Cluster` takes it (`kv_link_bandwidth`, `kv_link_latency_s`)."""

    bandwidth: float  # bytes/s
    latency_s: float

    @classmethod
    def fit(cls, num_bytes: list[int], seconds: list[float]) -> KVLink:
        """Least squares of seconds = latency + bytes / bandwidth. When the transfers cannot tell the two apart
        (one size only, or time not growing with bytes), all the time is charged to bandwidth."""
        if len(set(num_bytes)) > 1:
            slope, intercept = linear_regression(num_bytes, seconds)
            if slope > 0 and intercept >= 0:
                return cls(1 / slope, intercept)
        return cls(sum(num_bytes) / sum(seconds), 0.0)


def colocated_vs_simulated(prompts: list[list[int]], sides: Sides, *, budget: int = 256, output_len: int = 16
                           ) -> list[dict[str, Any]]:
    """[measured row, simulated row] for `prompts` (token ids, all arriving at once, `output_len` tokens each)
    on one colocated engine with chunked prefill under a token budget of `budget`: the baseline a 1P+1D pair
    has to beat, on the same prompts as `disaggregation_vs_simulated`. On this machine the one engine has
    every core, which the pair's two processes split. Rows are labelled `layout` and carry the pairing's
    `*_err_pct` columns; the simulated row adds `same_policy` (arrivals at once: the same steps)."""
    workload = Workload.from_token_ids(prompts, output_len)
    job = Job(workload, EngineConfig(max_num_batched_tokens=budget),
              {"layout": f"colocated, chunked {budget}"})
    rows = paired_rows([job], sides)
    if len(rows) == 2:
        rows[1]["same_policy"] = same_policy(rows[0]["metrics"], rows[1]["metrics"])
    return rows


def disaggregation_vs_simulated(prompts: list[list[int]], sides: Sides, *, model: str | Path | None = None,
                                output_len: int = 16, config: EngineConfig | None = None,
                                dtype: str = "float32") -> list[dict[str, Any]]:
    """[measured row, simulated row] for `prompts` (token ids, all arriving at once, `output_len` tokens
    each, greedy) on a 1P+1D pair: `model` (a path; None: SmolLM2) in the engine processes, priced by
    `sides` (hardware, arch, dtype) in the simulator. `config` serves both engines, as in `Cluster`. Both
    rows carry `mean_transfer_ms` and `transfer_bytes` (the simulator moves every prompt token's K/V, the
    engine all but the last token's, in whole blocks)."""
    from ref_engine.disagg import DisaggregatedLLM
    from ref_engine.sampling_params import SamplingParams

    config = config or EngineConfig()
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    # both engines run on this machine's one device: on a GPU each may take half the config's share of it
    pair_config = config.replace(gpu_memory_utilization=config.gpu_memory_utilization / 2)
    with DisaggregatedLLM(model, pair_config, pair_config, dtype=dtype) as llm:
        llm.generate(prompts[0][:8], SamplingParams(max_tokens=2))  # warm-up: first-call costs, not measured
        timings = [out.disagg_timings for out in llm.generate(prompts, params)]
    link = KVLink.fit([t.transfer_bytes for t in timings], [t.transfer_s for t in timings])
    cluster = Cluster(sides.simulated_arch(), sides.hardware, config, num_prefill_replicas=1,
                      num_decode_replicas=1, kv_link_bandwidth=link.bandwidth, kv_link_latency_s=link.latency_s,
                      dtype=sides.dtype or dtype)
    simulated = cluster.run(Workload.from_token_ids(prompts, output_len))
    cost_model = cluster.simulator.cost_model
    labels = {"layout": "1P+1D", "kv_link_gb_per_s": link.bandwidth / 1e9,
              "kv_link_latency_ms": link.latency_s * 1000}
    measured = {**labels, "side": "measured",
                "mean_ttft_ms": 1000 * fmean(t.ttft_s for t in timings),
                "mean_itl_ms": 1000 * fmean(gap for t in timings for gap in t.itl_s),
                "mean_prefill_ms": 1000 * fmean(t.prefill_s for t in timings),
                "mean_transfer_ms": 1000 * fmean(t.transfer_s for t in timings),
                "mean_decode_ms": 1000 * fmean(t.decode_s for t in timings),
                "transfer_bytes": sum(t.transfer_bytes for t in timings)}
    simulated_row = {**labels, "side": "simulated", "mean_ttft_ms": simulated.mean_ttft_ms,
                     "mean_itl_ms": simulated.mean_itl_ms,
                     "mean_transfer_ms": 1000 * fmean(cost_model.kv_transfer_time(len(p)) for p in prompts),
                     "transfer_bytes": sum(len(p) for p in prompts)
                     * sides.simulated_arch().kv_bytes_per_token(dtype_bytes(cost_model.kv_cache_dtype))}
    for key in ("mean_ttft_ms", "mean_itl_ms"):
        simulated_row[f"{key}_err_pct"] = relative_error(simulated_row[key], measured[key])
    return [measured, simulated_row]


# ---- the diagram ----


def pd_layout():
    """Lesson 3: colocated instances with chunked prefill against xP+yD disaggregation and its KV transfer."""
    fig, ax = canvas(11, 4.8, (0, 12), (0, 6))
    ax.text(0.1, 5.5, "colocated (chunked prefill)", fontsize=9, weight="bold")
    router = box(ax, 1.3, 4.5, "router", COLORS[3])
    for i, y in enumerate((5.0, 4.0)):
        inst = box(ax, 5.2, y, f"instance {i}: each step mixes decodes and\nprefill chunks within the token budget",
                   COLORS[0], fontsize=8)
        arrow(ax, router, inst)
    ax.text(8.3, 4.5, "one knob trades TTFT for ITL:\nthe token budget", fontsize=8, color="#555", va="center")
    ax.plot([0.1, 11.9], [3.25, 3.25], color="#ccc", lw=1)
    ax.text(0.1, 2.8, "disaggregated (xP + yD)", fontsize=9, weight="bold")
    router2 = box(ax, 1.3, 1.6, "router /\nproxy", COLORS[3])
    prefill = box(ax, 4.4, 1.6, "prefill instances (x)\nkv_role: producer\ncompute-bound", COLORS[1])
    decode = box(ax, 9.0, 1.6, "decode instances (y)\nkv_role: consumer\nmemory-bound", COLORS[2])
    arrow(ax, router2, prefill, "prompt")
    arrow(ax, prefill, decode, "KV cache over the link\n2 x layers x kv_heads x head_dim\nx bytes x prompt tokens",
          fontsize=7.5, offset=(0, 0.25))
    arrow(ax, decode, router2, "output tokens", rad=-0.3, offset=(0, -1.45))
    ax.set_title("Prefill/decode disaggregation: two pools sized separately, at the price of a KV transfer",
                 fontsize=11)
    fig.tight_layout()
    return fig


# ---- the demo (serving-lab demo) ----

DEMO_PRESETS = {
    "full": dict(budgets=(None, 64, 256), num_decodes=4, decode_output_len=24, long_prompt_len=320,
                 arrival_after_steps=4),
    "fast": dict(budgets=(None, 16), num_decodes=2, decode_prompt_len=8, decode_output_len=6, long_prompt_len=48,
                 arrival_after_steps=2),
}
GPU_STALL = dict(num_decodes=8, decode_output_len=64, long_prompt_len=1024)  # notebook 03's full sizes
GPU_BUDGETS = (None, 128, 512)


def demo(context: DemoContext) -> DemoReport:
    """The prefill stall (`prefill_stall`). A few requests are decoding when a long prompt
    arrives; unchunked, its whole prefill is one step and every decode waits for it; chunked under a token
    budget, the decodes keep their pace and the long prompt's first token comes a little later. Then the same on
    a simulated H100."""
    p = dict(context.preset(DEMO_PRESETS))
    rows = prefill_stall(p.pop("budgets"), context.sides(), **p)
    gpu = prefill_stall(GPU_BUDGETS, GPU, **GPU_STALL)
    labels = ("budget",)
    comparison = side_by_side(rows, labels, ("decode_max_itl_ms", "long_ttft_ms"))
    figure, (what_if,) = plot_comparison(comparison, labels, f"{p['num_decodes']} decodes running when a "
                                         f"{p['long_prompt_len']}-token prompt arrives")
    x = range(len(gpu))
    what_if.bar([i - 0.2 for i in x], [r["decode_max_itl_ms"] for r in gpu], 0.4, label="decodes' longest gap")
    what_if.bar([i + 0.2 for i in x], [r["long_ttft_ms"] for r in gpu], 0.4, label="long prompt's TTFT")
    what_if.set_xticks(list(x), [str(r["budget"]) for r in gpu])
    what_if.set(xlabel="token budget", ylabel="ms", title=gpu_name())
    what_if.legend(fontsize=7)
    return DemoReport(comparison, labels, figure, notes=[
        "decode_max_itl_ms: the longest gap a running decode saw (the stall); long_ttft_ms: the long prompt's TTFT",
        f"GPU what-if, {gpu_name()}: " + "; ".join(
            f"budget {r['budget']}: stall {r['decode_max_itl_ms']:.0f} ms, TTFT {r['long_ttft_ms']:.0f} ms"
            for r in gpu) + f" ({GPU_STALL['num_decodes']} decodes, a {GPU_STALL['long_prompt_len']}-token prompt)",
    ])
