"""`serving-lab`: the command line (pull the default model, generate, serve, bench serve, run the demo,
calibrate, manifest, simulate, sweep, report). Each command is a function `_<command>` with its parser's
`add_<command>_parser` beside it; `build_parser` composes them.

Lesson: lessons/00-orientation.md (how to run).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from core.config import DTYPES, INT4_GROUP_SIZES, KV_CACHE_DTYPES, QUANTIZATION_METHODS

if TYPE_CHECKING:
    from core.config import EngineConfig
    from core.metrics import RunMetrics

    # what `add_subparsers` returns: each `add_<command>_parser` adds its command to it
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def _pull(args: argparse.Namespace) -> None:
    # Each command imports only what it runs, so `serving-lab pull` and `--help` start without torch.
    from ref_engine.model.store import default_model_path

    print(default_model_path())


def add_pull_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("pull", help="download the default SmolLM2-135M-Instruct GGUF into the cache")
    p.set_defaults(func=_pull)


def _generate(args: argparse.Namespace) -> None:
    """Generate for each prompt, with a progress bar over the tokens; a prompt whose `--max-tokens` cannot fit
    the model's context is refused before anything runs (the engine would cut it short)."""
    from tqdm import tqdm

    from ref_engine import LLM, SamplingParams
    from ref_engine.sampling_params import RequestOutputKind

    llm = LLM(args.model, dtype=args.dtype, quantization=args.quantization,
              quantization_group_size=args.quantization_group_size, kv_cache_dtype=args.kv_cache_dtype,
              enforce_eager=args.enforce_eager, tensor_parallel_size=args.tensor_parallel_size,
              allow_cpu_oversubscription=args.allow_cpu_oversubscription)
    engine, tokenizer = llm.llm_engine, llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}]) if args.chat else p
               for p in args.prompts]
    context = engine.config.max_model_len
    for text, prompt in zip(args.prompts, prompts):
        room = context - len(tokenizer.encode(prompt))
        if args.max_tokens > room:
            raise ValueError(f"--max-tokens {args.max_tokens}: the model's context is {context} tokens and the prompt "
                             f"{text[:40]!r} takes {context - room}, so at most {max(room, 0)} tokens can follow it")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                            output_kind=RequestOutputKind.DELTA)
    texts = {str(i): "" for i in range(len(prompts))}
    for request_id, prompt in zip(texts, prompts):
        engine.add_request(request_id, prompt, params)
    with tqdm(total=len(prompts) * args.max_tokens, desc="generate", unit="tok", leave=False) as bar:
        while engine.has_unfinished_requests():
            for delta in engine.step():
                texts[delta.request_id] += delta.outputs[0].text
                bar.update(len(delta.outputs[0].token_ids))
    for prompt, text in zip(args.prompts, texts.values()):
        print(f"### {prompt}\n{text}\n")


def add_generate_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text with the reference engine")
    p.add_argument("prompts", nargs="+")
    p.add_argument("--model", default=None, help="GGUF file or Hugging Face folder (default: SmolLM2-135M)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--quantization", default=None, choices=list(QUANTIZATION_METHODS),
                   help="int8: 8-bit weights; int4: 4-bit weights (a GGUF's own Q4_1 blocks), both weight-only; "
                        "speed and quality in benchmarks/RESULTS.md")
    p.add_argument("--quantization-group-size", type=int, default=None,
                   help=f"weights per int4 scale and zero for a model quantized at load: "
                        f"{', '.join(map(str, INT4_GROUP_SIZES))} (default 32; a GGUF keeps its blocks' 32)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                   help="what the KV cache stores K/V in (auto: the model's dtype)")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True,
                   help="run the model eagerly (the default); --no-enforce-eager compiles it with torch.compile")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="worker processes the model is split over (1: in this process)")
    p.add_argument("--allow-cpu-oversubscription", action="store_true",
                   help="on a CPU, run more tensor-parallel ranks than cores (they take turns: slower, for study)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-chat", dest="chat", action="store_false", help="send the raw prompt, no chat template")
    p.set_defaults(func=_generate)


def _serve(args: argparse.Namespace) -> None:
    from ref_engine.entrypoints.openai.api_server import run_server

    run_server(args, serve_config(args))


def serve_config(args: argparse.Namespace) -> EngineConfig | None:
    """`serve --config MANIFEST`: read the manifest with the given flags written over its keys, put its
    model, served name, numerics, `api.stream` (`allow_streaming`) and `tenants:` (`tenants`, a
    `TenantPolicy` per tenant, None without the section) into `args`, and return its engine config, checked
    against this machine (`Manifest.llm_kwargs`: one line per key it cannot run, with the flag that
    overrides it) so that a bad value stops here rather than in the engine-core process.
    Without `--config`, the flags that only override a manifest are refused; returns None."""
    from serving_lab.manifest import OVERRIDE_FLAGS, load_manifest, naming_keys, simulated_arch

    overrides = _overrides(args)
    args.tenants = None
    if args.config is None:
        manifest_only = [flag for flag, key in OVERRIDE_FLAGS.items()
                         if key in overrides and flag.removeprefix("--").replace("-", "_") not in SERVE_KNOBS]
        if manifest_only:
            raise ValueError(f"{', '.join(manifest_only)} override a manifest's keys: give --config MANIFEST")
        return None
    if args.scheduling_policy is not None:
        raise ValueError("--scheduling-policy: with --config the manifest's api.admission.fairness sets the "
                         "policy (override it with --fairness none|per_tenant_budgets)")
    manifest = load_manifest(args.config, overrides)
    engine = manifest.llm_kwargs()
    args.model, args.served_model_name = engine["model"], manifest.engine.served_model_name
    args.dtype, args.quantization = engine["dtype"], engine["quantization"]
    args.kv_cache_dtype, args.enforce_eager = engine["kv_cache_dtype"], engine["enforce_eager"]
    args.tensor_parallel_size = engine["tensor_parallel_size"]
    args.allow_streaming = manifest.api.streaming
    args.tenants = manifest.tenant_policies() or None
    with naming_keys():
        return engine["config"].for_model(simulated_arch(manifest.engine.model, "engine.model")
                                          .max_position_embeddings)


def add_serve_parser(subparsers: Subparsers) -> None:
    from ref_engine.entrypoints.openai.cli_args import add_serve_args

    p = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP server (streaming, /metrics) on the engine")
    add_serve_args(p)
    # --model too (vLLM's `vllm serve` takes both), beside the positional MODEL: the flag the manifest's
    # engine.model override is named by
    _add_override_flags(p, skip=tuple(knob for knob in SERVE_KNOBS if knob != "model"))
    p.set_defaults(func=_serve)


def _bench_serve(args: argparse.Namespace) -> None:
    from serving_lab.bench_serve import main as bench_serve_main

    bench_serve_main(args)


def add_bench_parser(subparsers: Subparsers) -> None:
    from serving_lab.bench_predict import add_predict_args
    from serving_lab.bench_serve import add_bench_serve_args

    p = subparsers.add_parser("bench", help="benchmarks: `bench serve` loads an OpenAI-compatible server")
    bench = p.add_subparsers(dest="bench_command", required=True)
    p = bench.add_parser("serve", help="send a workload to a server and measure TTFT, ITL, TPOT, throughput")
    add_bench_serve_args(p)
    add_predict_args(p)
    p.set_defaults(func=_bench_serve)


def _calibrate(args: argparse.Namespace) -> None:
    from serving_lab.calibrate import calibrate

    calibrate(args.model, dtype=args.dtype, quantization=args.quantization)


def add_calibrate_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure this machine with the engine and save its simulator profile")
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--quantization", default=None, choices=list(QUANTIZATION_METHODS),
                   help="measure the int8 or int4 engine and save its profile, whose rates the simulator prices "
                        "under that name (int8: 1-byte weights; int4: 0.625 bytes a weight with its scales)")
    p.set_defaults(func=_calibrate)


def _demo(args: argparse.Namespace) -> None:
    from course import DEMOS, demo_list

    if args.list:
        print(demo_list())
    elif args.lesson is None:
        if args.fast or args.hardware:
            raise ValueError("--fast and --hardware go with a lesson's demo (serving-lab demo --list names them)")
        from course.orientation import main as demo_main

        demo_main(out_dir=args.out or "reports/demo", model=args.model)
    else:
        from course.demo import DemoContext, run_demo

        run_demo(DEMOS[args.lesson], DemoContext(fast=args.fast, model_path=args.model, hardware=args.hardware), args.out)


def add_demo_parser(subparsers: Subparsers) -> None:
    from course import DEMOS

    p = subparsers.add_parser("demo", help="the course demo, or one lesson's: engine and simulator side by side")
    p.add_argument("lesson", nargs="?", choices=list(DEMOS), metavar="LESSON",
                   help=f"one lesson's demo: {', '.join(DEMOS)} (--list says what each shows; none: the overview)")
    p.add_argument("--list", action="store_true", help="list the lessons' demos")
    p.add_argument("--fast", action="store_true", help="tiny sizes, seconds: a smoke test, not a measurement")
    p.add_argument("--model", default=None)
    p.add_argument("--hardware", default=None,
                   help="the simulator's profile of this machine (default: its calibration, measured once)")
    p.add_argument("--out", default=None,
                   help="folder for the report and plot (default: reports/demo, a lesson's reports/demo/LESSON)")
    p.set_defaults(func=_demo)


# `serve`'s own flags that also override a manifest key (ref_engine/entrypoints/openai/cli_args.py): they
# mean the same without a manifest, so `serve` keeps them and takes only the other override flags.
SERVE_KNOBS = ("model", "served_model_name", "max_model_len", "max_num_seqs", "dtype", "quantization",
               "kv_cache_dtype", "enforce_eager", "tensor_parallel_size")


def _add_override_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The flags that override a manifest's keys (but those whose dest is in `skip`, which the parser has
    already); each value is read as YAML, as the file's would be, but a model's name (`TEXT_OVERRIDES`)."""
    import yaml

    from serving_lab.manifest import OVERRIDE_FLAGS, TEXT_OVERRIDES

    group = parser.add_argument_group("manifest overrides (a flag wins over the file)")
    for flag, key in OVERRIDE_FLAGS.items():
        if flag.removeprefix("--").replace("-", "_") not in skip:
            group.add_argument(flag, type=str if key in TEXT_OVERRIDES else yaml.safe_load,
                               default=argparse.SUPPRESS, metavar="VALUE", help=key)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    from serving_lab.manifest import OVERRIDE_FLAGS

    given = vars(args)
    return {key: given[dest] for flag, key in OVERRIDE_FLAGS.items()
            if (dest := flag.removeprefix("--").replace("-", "_")) in given}


def _manifest(args: argparse.Namespace) -> None:
    from serving_lab.manifest import load_manifest
    from serving_lab.vllm_command import vllm_serve_command

    print(vllm_serve_command(load_manifest(args.to_vllm, _overrides(args))))


def add_manifest_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("manifest",
                              help="translate a deployment manifest (e.g. serving_lab/manifests/smollm2.yaml)")
    p.add_argument("--to-vllm", metavar="MANIFEST", required=True,
                   help="print the `vllm serve` command line that runs the same deployment")
    _add_override_flags(p)
    p.set_defaults(func=_manifest)


def _simulate(args: argparse.Namespace) -> None:
    from serving_lab.manifest import MANIFEST_METRICS, load_manifest, naming_keys
    from serving_lab.workload_spec import check_prompt_lengths, parse_workload
    from sim.simulator import Simulator, resolve_hardware
    from sim.spec_decode import AcceptanceRate

    if args.speed is not None and not args.dashboard:
        raise ValueError("--speed sets the pace of the dashboard's replay: give --dashboard too")
    manifest = load_manifest(args.config, _overrides(args))
    workload = parse_workload(args.workload)
    speculating = manifest.optional.speculative_decoding is not None
    if args.acceptance_rate is not None and not speculating:
        raise ValueError(f"--acceptance-rate {args.acceptance_rate}: prices optional.speculative_decoding, which "
                         "this manifest leaves null")
    # The manifest holds no acceptance rate: without one the drafts cannot be priced, so the run leaves them out
    # and says so, rather than inventing a rate.
    priced = args.acceptance_rate is not None
    acceptance = AcceptanceRate((args.acceptance_rate,)) if priced else None
    with naming_keys():
        deployment = manifest.simulator_kwargs(priced)  # an unknown model is named before any word on calibration
        hardware = resolve_hardware(args.hardware)
        simulator = Simulator(hardware=hardware, acceptance=acceptance, engine=args.engine, **deployment)
        check_prompt_lengths(workload, simulator.config.max_model_len)
        if args.dashboard:
            from serving_lab.dashboard_replay import serve_replay
            from sim.dashboard_replay import Replay, record_simulation

            speed = 1.0 if args.speed is None else args.speed
            recording = record_simulation(simulator, workload, speed, f"{manifest.service}: {simulator.arch.name} on "
                                          f"{hardware.name}, {args.workload}, at {speed:g}x")
            run = recording.run
        else:
            run = simulator.run(workload)
    print(f"{manifest.service}: {simulator.arch.name} on {hardware.name} "
          f"(tensor_parallel_size={simulator.tensor_parallel_size}), workload {args.workload}")
    if speculating and not priced:
        print("  optional.speculative_decoding: not priced (no acceptance rate; give --acceptance-rate A, and "
              "--speculative-model NAME if the simulator does not know the draft)")
    print(f"  {run.completed} completed, {run.failed} failed in {run.duration:.3f} s simulated "
          f"({run.request_throughput:.2f} requests/s)")
    width = max(map(len, manifest.metrics))
    for name in manifest.metrics:
        metric = MANIFEST_METRICS[name]
        print(f"  {name:<{width}}  {metric.report(run)}  [{metric.vllm_series}]")
    if any(request.tenant is not None for request in workload.requests):
        print("\n".join(_tenant_lines(run, simulator.config, manifest.api.admission.fairness)))
    if run.failed:
        raise ValueError(f"{run.failed} of {len(workload)} requests failed in the simulator")
    if args.dashboard:
        serve_replay(Replay(recording, speed), args.host, args.port)


def _tenant_lines(run: RunMetrics, config: EngineConfig, fairness: str) -> list[str]:
    """Per tenant: its requests, its share of the service while every tenant still had work (the window
    `RunMetrics.jain_fairness` judges), its weight's share under fair scheduling, and its TTFT."""
    fair = config.scheduling_policy == "fair"
    weights = dict(config.tenant_weights or ()) if fair else {}
    service = run.tenant_service()
    total_service = sum(service.values()) or 1
    total_weight = sum(weights.get(tenant, 1.0) for tenant in service)
    lines = [f"  per tenant (api.admission.fairness: {fairness}; Jain's index {run.jain_fairness(weights):.3f}):",
             f"    {'tenant':<12} {'requests':>8} {'service share':>13} {'weight share':>12} "
             f"{'mean TTFT ms':>12} {'p99 TTFT ms':>11}"]
    for tenant, stats in sorted(run.per_tenant.items()):
        weight = f"{weights.get(tenant, 1.0) / total_weight:.1%}" if fair else "-"
        lines.append(f"    {tenant:<12} {stats.requests:>8} {service[tenant] / total_service:>13.1%} {weight:>12} "
                     f"{stats.mean_ttft_ms:>12.1f} {stats.p99_ttft_ms:>11.1f}")
    return lines


def add_simulate_parser(subparsers: Subparsers) -> None:
    from serving_lab.workload_spec import WORKLOAD_SPEC

    p = subparsers.add_parser("simulate", help="run a deployment manifest on a workload in the simulator")
    p.add_argument("--config", metavar="MANIFEST", required=True, help="the deployment manifest (YAML)")
    p.add_argument("--workload", metavar="SPEC", required=True, help=f"{WORKLOAD_SPEC}, e.g. synthetic:64:128:64:8")
    p.add_argument("--hardware", default=None, help="a hardware profile: h100-sxm, a100-80gb-sxm, h200, l40s, b200, "
                   "local-cpu or a calibrated one (default: this machine's calibration, else local-cpu)")
    p.add_argument("--acceptance-rate", type=float, default=None,
                   help="with speculative decoding: the chance each draft token is accepted (without it the "
                   "drafts are left out of the price, and the output says so)")
    p.add_argument("--engine", default=None, choices=["vllm"],
                   help="add an engine's own CPU time per step to a GPU profile's price (vllm: vLLM V1's, fitted on "
                   "its published rows; default: none, the profile as fitted)")
    p.add_argument("--dashboard", action="store_true",
                   help="then replay the run on the live dashboard's page (http://HOST:PORT/dashboard) until Ctrl-C")
    p.add_argument("--speed", type=float, default=None,
                   help="with --dashboard: simulated seconds per second of replay (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="with --dashboard: the page's address")
    p.add_argument("--port", type=int, default=8001, help="with --dashboard: the page's port")
    _add_override_flags(p)
    p.set_defaults(func=_simulate)


def _sweep(args: argparse.Namespace) -> None:
    from serving_lab.manifest import load_manifest
    from serving_lab.pairing import format_table
    from serving_lab.sweep import SLO, TABLE_METRICS, Sweep, load_grid, run_sweep

    sweep = Sweep(load_manifest(args.config, _overrides(args)), load_grid(args.grid), args.workload, hardware=args.hardware,
                  slos=(SLO(args.slo_ttft_ms, args.slo_tpot_ms),) if args.slo_ttft_ms or args.slo_tpot_ms else (),
                  seed=args.seed)
    result = run_sweep(sweep, args.out, measure_front=args.measure_front, repeats=args.repeats, progress=True,
                       force=args.force, jobs=args.jobs)
    columns = ["point", "side", *TABLE_METRICS[:6], *(["goodput"] if "goodput" in result.rows[0] else [])]
    front = [r for r in result.simulated() if r["on_front"]]
    print(f"{len(result.simulated())} points simulated on {sweep.hardware.name}; the Pareto front "
          f"(throughput up, p99 ITL and p99 TTFT down), {len(front)} points:")
    print(format_table(front, columns))
    if result.measured():
        agreement = result.agreement
        print(f"\nmeasured on the engine, {len(result.measured())} points:")
        judged = [c for c in ("agreement", "mean_kl") if any(c in row for row in result.measured())]
        print(format_table(result.measured(), [*columns, "prefix_cache_hit_rate", "draft_acceptance_rate", "slowdown",
                                               *judged]))
        if judged:
            print("agreement, mean_kl: the point's greedy outputs and next-token distributions against float32 on "
                  "the eval set (serving_lab/eval_set.py); blank: the float32 path itself")
        print(f"rank agreement (Spearman's rho of {agreement['metric']}, simulated vs measured): "
              f"{agreement['rho']:.2f} over {len(agreement['points'])} points")
    if args.out:
        print(f"\ntable: {args.out}/sweep.csv, {args.out}/sweep.json")


def add_sweep_parser(subparsers: Subparsers) -> None:
    from serving_lab.workload_spec import WORKLOAD_SPEC

    p = subparsers.add_parser("sweep", help="a grid of knobs through the simulator (a few points on the engine): "
                              "the Pareto front and the simulator's rank agreement")
    p.add_argument("--config", metavar="MANIFEST", required=True, help="the base deployment manifest (YAML)")
    p.add_argument("--grid", metavar="GRID", required=True,
                   help="YAML: knob -> list of values, and `measure:` points to run on the engine too")
    p.add_argument("--workload", metavar="SPEC", required=True, help=f"{WORKLOAD_SPEC}")
    p.add_argument("--hardware", default=None, help="the simulator's profile (default: this machine's calibration)")
    p.add_argument("--out", default=None, help="folder for sweep.csv and sweep.json; a sweep resumes from it")
    p.add_argument("--measure-front", action="store_true", help="also run the simulated Pareto front on the engine")
    p.add_argument("--repeats", type=int, default=2, help="engine runs per measured point (fastest kept)")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="SLO on TTFT, for goodput")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="SLO on TPOT, for goodput")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="simulate this many points at once (processes; default 1)")
    p.add_argument("--force", action="store_true", help="start over in an --out folder holding another sweep")
    _add_override_flags(p)
    p.set_defaults(func=_sweep)


def _report(args: argparse.Namespace) -> None:
    from serving_lab.report import run_report, write_report

    if args.simulate_only and args.hardware is None:
        raise ValueError("--simulate-only needs --hardware NAME (e.g. local-cpu, h100-sxm): without the engine "
                         "there is no calibration to price this machine with")
    report = run_report(args.before, args.after, args.workload, hardware=args.hardware, repeats=args.repeats,
                        measure=not args.simulate_only, seed=args.seed)
    out = write_report(report, args.out, force=args.force)
    speedup = report.results["speedup"]
    measured = speedup["measured"]
    print("speed-up in output throughput: "
          + (f"{measured['median']:.2f}x measured (range {measured['min']:.2f}-{measured['max']:.2f}x), "
             if measured else "")
          + f"{speedup['simulated']:.2f}x simulated")
    print(f"report: {out}/report.html ({out}/report.md, {out}/results.json, plots)")


def add_report_parser(subparsers: Subparsers) -> None:
    from serving_lab.workload_spec import WORKLOAD_SPEC

    p = subparsers.add_parser("report", help="the capstone's before -> after throughput report (engine and simulator)")
    p.add_argument("--before", metavar="MANIFEST", required=True)
    p.add_argument("--after", metavar="MANIFEST", required=True)
    p.add_argument("--workload", metavar="SPEC", required=True, help=f"{WORKLOAD_SPEC}")
    p.add_argument("--out", required=True, help="the report's folder (written whole, or not at all)")
    p.add_argument("--repeats", type=int, default=3, help="engine runs per configuration, interleaved")
    p.add_argument("--hardware", default=None, help="the simulator's profile (default: this machine's calibration)")
    p.add_argument("--simulate-only", action="store_true", help="run the simulator only (needs --hardware)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace an existing --out folder")
    p.set_defaults(func=_report)


def _plan(args: argparse.Namespace) -> None:
    from serving_lab.manifest import load_manifest, naming_keys
    from serving_lab.pairing import format_table
    from serving_lab.plan import PlanTarget, plan
    from serving_lab.workload_spec import check_prompt_lengths, parse_workload
    from sim.simulator import resolve_hardware

    target = PlanTarget(args.slo_ttft_ms, args.slo_tpot_ms, args.usd_per_gpu_hour, args.attainment,
                        args.max_replicas, args.router)
    manifest = load_manifest(args.config, _overrides(args))
    workload = parse_workload(args.workload)
    check_prompt_lengths(workload, manifest.engine_config().max_model_len)
    try:
        sizes = [int(size) for size in args.tensor_parallel_sizes.split(",")]
    except ValueError:
        raise ValueError(f"--tensor-parallel-sizes {args.tensor_parallel_sizes!r}: give integers, e.g. 1,2,4") from None
    with naming_keys():
        hardware = resolve_hardware(args.hardware)
        rows = plan(manifest, workload, hardware, target, sizes)
    slo = (f"{target.attainment:.0%} of requests within TTFT <= {target.ttft_ms:g} ms and TPOT <= "
           f"{target.tpot_ms:g} ms")
    best = rows[0]
    if not best["meets_slo"]:
        print(f"no plan: no fleet of up to {target.max_replicas} replicas on {hardware.name} keeps {slo} "
              f"(tensor parallel sizes {args.tensor_parallel_sizes})")
    else:
        print(f"plan: {best['replicas']} replica(s) x tensor parallel {best['tensor_parallel_size']} = {best['gpus']} "
              f"GPU(s) of {hardware.name}, ${best['usd_per_hour']:g}/hour, ${best['usd_per_M_tokens']:g} per million "
              f"output tokens at ${target.usd_per_gpu_hour:g} per GPU-hour; {best['attainment_%']}% within the SLO "
              f"({slo}), router {target.router}, workload {args.workload}")
    print(format_table(rows, list(rows[0])))


def add_plan_parser(subparsers: Subparsers) -> None:
    from serving_lab.workload_spec import WORKLOAD_SPEC

    p = subparsers.add_parser("plan", help="the fewest replicas (and tensor-parallel degree) that meet SLOs on a "
                              "workload, and the cost per million tokens, in the simulator")
    p.add_argument("--config", metavar="MANIFEST", required=True, help="the deployment manifest (YAML)")
    p.add_argument("--workload", metavar="SPEC", required=True,
                   help=f"the whole fleet's traffic: {WORKLOAD_SPEC}, e.g. trace:azure-conv-2023:2000:40")
    p.add_argument("--hardware", default=None, help="the GPU profile, e.g. h100-sxm (default: this machine's calibration)")
    p.add_argument("--slo-ttft-ms", type=float, required=True)
    p.add_argument("--slo-tpot-ms", type=float, required=True)
    p.add_argument("--usd-per-gpu-hour", type=float, required=True, help="the price of one GPU-hour (your assumption)")
    p.add_argument("--attainment", type=float, default=0.9, help="share of requests that must meet both SLOs")
    p.add_argument("--tensor-parallel-sizes", default="1", help="degrees to try, comma-separated (default 1)")
    p.add_argument("--max-replicas", type=int, default=16, help="the largest fleet tried per degree")
    p.add_argument("--router", default="least_loaded", help="the fleet's router (sim/router.py's names)")
    _add_override_flags(p)
    p.set_defaults(func=_plan)


DESCRIPTION = ("Serving Lab's command line: pull the default model, generate text, serve it over an OpenAI-compatible "
               "API, benchmark a server, run a lesson's demo, calibrate this machine's profile, and turn a deployment "
               "manifest into a vllm serve command, a simulation, a sweep, a capacity plan or a before/after report.")


def build_parser() -> argparse.ArgumentParser:
    """The `serving-lab` parser: one subcommand per `add_<command>_parser`, in the order `--help` lists them."""
    parser = argparse.ArgumentParser(prog="serving-lab", description=DESCRIPTION)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add_parser in (add_pull_parser, add_generate_parser, add_serve_parser, add_bench_parser,
                       add_calibrate_parser, add_demo_parser, add_manifest_parser, add_simulate_parser,
                       add_sweep_parser, add_plan_parser, add_report_parser):
        add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run one command; an error the user can fix (a bad manifest, flag or file) is one message and exit 2;
    Ctrl-C stops it with one line and exit 130 (the shell's status for SIGINT), no traceback."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"serving-lab: error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("\nserving-lab: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
