"""Every lesson experiment, once: the same workload through the simulator and the real engine, as a table.

Each function returns a list of rows (plain dicts, one per configuration and side) that a notebook prints,
plots and asserts on. The columns are `RunMetrics` fields plus `side` ("measured" | "simulated") and, on
simulated rows, `*_err_pct`: the simulated number's error relative to the measured one. The engine is only
imported when a measured side is asked for, so simulator-only sweeps run without torch.

Rule of the house (lessons/CONTRIBUTING.md, "Experiments"): numbers the shared core decides (steps, batch composition,
preemptions) must be identical on both sides for workloads whose arrivals do not depend on timing; only
times may differ, and every table shows by how much.

One module per lesson, on top of what they share:
    common.py        Sides, run_pair, rows, policy checks, drift checks, tables
    claims.py        timing claims: asserted on a steady machine, skipped loudly on an unsteady one
    batching.py      lesson 1: the cost of a step, static vs continuous batching, load and capacity
    paged.py         lesson 2: KV arithmetic, allocators, block size, preemption by recompute or swap
    scheduler.py     lesson 3: the prefill stall, the token-budget dial, capacity, fairness, colocated vs xP+yD
    disaggregation.py  lesson 3: prefill/decode disaggregation, a real 1P+1D pair vs the simulated cluster
    prefix.py        lesson 4: prefix caching
    speculation.py   lesson 5: speculative decoding
    architecture.py  lesson 6: the architecture map, requests traced through a running server
    tuning.py        lesson 7: sweeps, the Pareto front, SLO picks, numerics, the roofline floor (as `ex.tuning`)
Notebooks import the package (`import serving_lab.experiments as ex`); everything public is re-exported here,
but lesson 7's functions, which keep their module's name (`ex.tuning.sweep`, `ex.tuning.roofline`).
"""

from serving_lab.experiments import tuning
from serving_lab.experiments.architecture import (
    TracedRequest,
    TracedServer,
    admission_order,
    architecture_diagram,
    load_rows,
    max_batch_size,
    request_slowdown,
    simulated_request,
    step_rows,
    trace_request,
    traced_load,
    ttft_breakdown,
)
from serving_lab.experiments.batching import (
    capacity,
    load_sweep,
    plot_timeline,
    static_vs_continuous,
    step_cost,
    throughput_ratios,
)
from serving_lab.experiments.claims import BUSY, error_claim, fit_note, machine_note, timing_claim
from serving_lab.pairing import (
    COMPARED,
    POLICY_COUNTS,
    Job,
    Sides,
    drift_note,
    drift_notes,
    error_check,
    format_table,
    machine_slowdown,
    metrics_row,
    paired_rows,
    pairs,
    prefill_slowdown,
    run_pair,
    same_policy,
)
from serving_lab.experiments.disaggregation import KVLink, disaggregation_vs_simulated
from serving_lab.experiments.paged import (
    ALLOCATION_MODES,
    KV_MODELS,
    PCIE4_BATCHED,
    PCIE4_PER_BLOCK,
    SwapLink,
    SwapPricingTimer,
    allocation_modes,
    block_size_sweep,
    engine_kv_bytes,
    host_copy_link,
    kv_cache_sizes,
    memory_stats,
    plot_memory,
    pool_squeeze,
    preemption_cost,
    preemption_modes,
    same_memory,
)
from serving_lab.experiments.prefix import (
    chat_replay,
    eviction_sweep,
    hit_rate_sweep,
    shared_prefix_ttft,
    tenant_isolation,
)
from serving_lab.experiments.scheduler import (
    budget_dial,
    capacity_vs_budget,
    colocated_vs_disaggregated,
    fairness_workload,
    kv_link_sweep,
    max_rate_within,
    prefill_stall,
    service_curves,
    stall_workload,
    tenant_fairness,
    timelines,
    weighted_service_ratio,
)
from serving_lab.experiments.speculation import (
    CHAT_TEMPLATE,
    COPY_INSTRUCTIONS,
    GROUNDED_TEXTS,
    acceptance_by_temperature,
    draft_model_sweep,
    grounded_prompts,
    measured_batch_sweep,
    measured_verify_cost,
    speculation,
    speculation_batch_sweep,
    speedups,
)

__all__ = [
    # lesson 6
    "TracedRequest", "TracedServer", "admission_order", "architecture_diagram", "load_rows", "max_batch_size",
    "request_slowdown", "simulated_request", "step_rows", "trace_request", "traced_load", "ttft_breakdown",
    "COMPARED",
    "POLICY_COUNTS",
    "Sides",
    "run_pair",
    "Job",
    "paired_rows",
    "metrics_row",
    "machine_slowdown",
    "prefill_slowdown",
    "drift_note",
    "drift_notes",
    "error_check",
    "pairs",
    "same_policy",
    "format_table",
    "BUSY",
    "fit_note",
    "machine_note",
    "timing_claim",
    "error_claim",
    "step_cost",
    "static_vs_continuous",
    "throughput_ratios",
    "capacity",
    "load_sweep",
    "plot_timeline",
    "KV_MODELS",
    "ALLOCATION_MODES",
    "kv_cache_sizes",
    "engine_kv_bytes",
    "memory_stats",
    "same_memory",
    "allocation_modes",
    "plot_memory",
    "block_size_sweep",
    "SwapLink",
    "PCIE4_PER_BLOCK",
    "PCIE4_BATCHED",
    "host_copy_link",
    "SwapPricingTimer",
    "preemption_modes",
    "pool_squeeze",
    "preemption_cost",
    "KVLink",
    "disaggregation_vs_simulated",
    "prefill_stall",
    "stall_workload",
    "timelines",
    "budget_dial",
    "capacity_vs_budget",
    "fairness_workload",
    "tenant_fairness",
    "service_curves",
    "weighted_service_ratio",
    "colocated_vs_disaggregated",
    "max_rate_within",
    "kv_link_sweep",
    "shared_prefix_ttft",
    "hit_rate_sweep",
    "eviction_sweep",
    "tenant_isolation",
    "chat_replay",
    "CHAT_TEMPLATE",
    "GROUNDED_TEXTS",
    "COPY_INSTRUCTIONS",
    "grounded_prompts",
    "speculation",
    "speedups",
    "speculation_batch_sweep",
    "measured_batch_sweep",
    "measured_verify_cost",
    "acceptance_by_temperature",
    "draft_model_sweep",
    "tuning",
]
