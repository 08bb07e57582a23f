"""Lesson 0, the course overview (`serving-lab demo`): lesson 1's experiment on the default model, simulated and
measured, as a report.

It shows the whole kit in a few minutes on a laptop CPU: the real engine answers a chat prompt; this
machine's calibrated profile is loaded (or measured, once, ~2 minutes); static and continuous batching
serve the same workload in the engine and in the simulator, side by side with the error; then the
simulator, with a datasheet A100 profile and a 7B model, shows the curve the papers report, where a
learner's CPU cannot go. Output: `report.md` and `static_vs_continuous.png` in the chosen folder.

Lesson: lessons/00-orientation.md#quick-start, lessons/01-continuous-batching.md (static vs continuous batching).
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

from core import EngineConfig, Exponential, Workload
from course.continuous_batching import static_vs_continuous
from serving_lab.calibrate import load_or_calibrate
from serving_lab.pairing import Sides
from sim.simulator import Simulator

ENGINE_CAPS = (16, 96)  # output-length caps for the measured comparison (exponential outputs, mean 32)
GPU_CAPS = (32, 128, 512, 1536)  # the Anyscale protocol's caps, simulated on a GPU profile


def gpu_ratios(caps: tuple[int, ...] = GPU_CAPS, num_requests: int = 512) -> list[dict[str, Any]]:
    """Simulated continuous/static throughput on Llama-2-7B, A100-80GB (datasheet), outputs Exp(128)."""
    rows = []
    for cap in caps:
        workload = Workload.synthetic(num_requests, prompt_len=512, output_len=Exponential(128, cap), seed=0)
        tput = {}
        for scheduling in ("static", "continuous"):
            config = EngineConfig(max_num_seqs=64, max_num_batched_tokens=8192, scheduling=scheduling)
            tput[scheduling] = Simulator("llama-2-7b", "a100-80gb-sxm", config).run(workload).output_throughput
        rows.append({"cap": cap, **tput, "ratio": tput["continuous"] / tput["static"]})
    return rows


def main(out_dir: str | Path = "reports/demo", model: str | None = None) -> Path:
    # Torch, the engine and matplotlib only when the demo runs (`gpu_ratios` is simulator-only); the Agg
    # backend must be chosen before pyplot is imported.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from ref_engine import LLM, SamplingParams
    from ref_engine.model.loader import load_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    print("1/4 loading the model and answering one prompt with the real engine ...")
    loaded = load_model(model)
    llm = LLM(loaded)
    question = "In one sentence, what is continuous batching in LLM serving?"
    prompt = llm.get_tokenizer().apply_chat_template([{"role": "user", "content": question}])
    answer = llm.generate([prompt], SamplingParams(max_tokens=48, temperature=0), use_tqdm=False)[0]
    print(f"   {answer.outputs[0].text!r}")

    print("2/4 this machine's calibrated profile (cached; refit when the machine's speed has moved) ...")
    profile = load_or_calibrate(loaded)

    print("3/4 static vs continuous batching, engine and simulator, same workload ...")
    rows = static_vs_continuous(ENGINE_CAPS, Sides(model=loaded, hardware=profile))
    print("4/4 the same question on a simulated A100 with a 7B model ...")
    gpu = gpu_ratios()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"cap {r['cap']}\n{r['scheduling']}" for r in rows if r["side"] == "measured"]
    measured = [r["output_throughput"] for r in rows if r["side"] == "measured"]
    simulated = [r["output_throughput"] for r in rows if r["side"] == "simulated"]
    x = range(len(labels))
    ax1.bar([i - 0.2 for i in x], measured, 0.4, label="measured (engine)")
    ax1.bar([i + 0.2 for i in x], simulated, 0.4, label="simulated")
    ax1.set_xticks(list(x), labels)
    ax1.set_ylabel("output tokens/s")
    ax1.set_title(f"{loaded.model_id} on this CPU")
    ax1.legend()
    ax2.plot([r["cap"] for r in gpu], [r["ratio"] for r in gpu], marker="o")
    ax2.set_xscale("log")
    ax2.set_xlabel("output-length cap (exponential outputs, mean 128)")
    ax2.set_ylabel("continuous / static throughput")
    ax2.set_title("Llama-2-7B, A100-80GB (simulated, datasheet)")
    fig.tight_layout()
    fig.savefig(out / "static_vs_continuous.png", dpi=120)

    lines = [
        "# Serving Lab demo: static vs continuous batching", "",
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; model {loaded.model_id} (float32); profile `{profile.name}` "
        f"(calibrated {profile.provenance.get('date')}, fit error {profile.provenance.get('fit_mean_abs_error_pct')}%).",
        "", f"Engine answer to {question!r}: {answer.outputs[0].text!r}", "",
        "## Same workload, engine and simulator", "",
        "16 requests, 64-token prompts, exponential outputs (mean 32) capped, all at once, max_num_seqs=8.", "",
        "| cap | scheduling | side | output tok/s | mean TTFT ms | steps | error (throughput) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        err = f"{r['output_throughput_err_pct']:+.1f}%" if r["side"] == "simulated" else ""
        lines.append(f"| {r['cap']} | {r['scheduling']} | {r['side']} | {r['output_throughput']:.1f} | "
                     f"{r['mean_ttft_ms']:.0f} | {r['num_steps']} | {err} |")
    lines += ["", "## The papers' shape, simulated on a GPU", "",
              "512 requests, 512-token prompts, exponential outputs (mean 128) capped, max_num_seqs=64.", "",
              "| cap | static tok/s | continuous tok/s | continuous / static |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['cap']} | {r['static']:.0f} | {r['continuous']:.0f} | {r['ratio']:.2f}x |" for r in gpu]
    lines += ["", "![static vs continuous](static_vs_continuous.png)", "",
              f"Generated by `serving-lab demo` in {time.perf_counter() - started:.0f} s. "
              "Lesson: lessons/01-continuous-batching.md.", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    print(f"report: {report}")
    return report
