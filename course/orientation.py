"""Lesson 0, the course overview (`serving-lab demo`): lesson 1's experiment on the default model, simulated and
measured, as a report.

It shows the whole kit in a few minutes on a laptop CPU: the real engine answers a chat prompt; this
machine's calibrated profile is loaded (or measured, once, ~2 minutes); static and continuous batching
serve the same workload in the engine and in the simulator, side by side with the error; then the
simulator, with lesson 1's GPU what-if (Llama-3.1-8B on a datasheet H100), shows the curve the papers report,
where a learner's CPU cannot go. The terminal and the report end with the takeaway: the measured and simulated
gains, the simulator's error, what they mean and where to go next. Output: `report.md` and
`static_vs_continuous.png` in the chosen folder.

Lesson: lessons/00-orientation.md#quick-start, lessons/01-continuous-batching.md (static vs continuous batching).
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

from course.claims import machine_note
from course.continuous_batching import static_vs_continuous, throughput_ratios
from serving_lab.calibrate import BUSY_MACHINE_REMEDY, load_or_calibrate
from serving_lab.pairing import Sides
from sim.hardware import HardwareProfile

ENGINE_CAPS = (16, 96)  # output-length caps for the measured comparison (exponential outputs, mean 32)
GPU_CAPS = (32, 128, 512, 1536)  # the Anyscale protocol's caps, simulated on a GPU profile
GPU = Sides(arch="llama-3.1-8b", hardware="h100-sxm", measure=False)  # lesson 1's what-if: simulated only


def gpu_ratios(caps: tuple[int, ...] = GPU_CAPS, num_requests: int = 512) -> list[dict[str, Any]]:
    """Simulated continuous/static throughput for lesson 1's GPU what-if: Llama-3.1-8B on an H100 (datasheet),
    64-token prompts, outputs Exp(128) capped, max_num_seqs=64 (the notebook's experiment in fast mode)."""
    rows = static_vs_continuous(caps, GPU, num_requests=num_requests, prompt_len=64, mean_output=128,
                                max_num_seqs=64)
    return throughput_ratios(rows)


def takeaway(rows: list[dict[str, Any]], gpu: list[dict[str, Any]], profile: HardwareProfile) -> list[str]:
    """The demo's closing lines: the gain at the largest cap, measured and simulated, the simulator's error,
    what it means (or that a busy machine spoiled the measurement, and what to do), and where to go next."""
    cap = max(r["cap"] for r in rows)
    ratio = {r["side"]: r["ratio"] for r in throughput_ratios(rows) if r["cap"] == cap}
    errors = [abs(r["output_throughput_err_pct"]) for r in rows if r["side"] == "simulated"]
    steps = {(r["cap"], r["scheduling"], r["side"]): r["num_steps"] for r in rows}
    same_steps = all(steps[(c, s, "measured")] == steps[(c, s, "simulated")] for c, s, _ in steps)
    unsteady = machine_note(profile, rows=rows)
    lines = [
        f"Takeaway: with outputs capped at {cap} tokens, continuous batching served {ratio['measured']:.2f}x the "
        f"output tokens/s of static batching on this machine; the simulator predicted {ratio['simulated']:.2f}x "
        f"(its throughput within {max(errors):.0f}% of the engine's in every run"
        + (", with the same number of steps: the engine and the simulator made the same decisions)." if same_steps
           else ").")]
    if unsteady:
        lines.append(f"Machine unsteady ({unsteady}): the measured side is not this machine's best; {BUSY_MACHINE_REMEDY}.")
    return lines + [
        f"On a simulated H100 serving Llama-3.1-8B the gain grows with the spread of output lengths: "
        f"{gpu[0]['ratio']:.2f}x at cap {gpu[0]['cap']} to {gpu[-1]['ratio']:.2f}x at cap {gpu[-1]['cap']}. "
        "Static batching waits for a batch's longest request; continuous batching refills each slot as it frees.",
        "Next: lessons/README.md (the course), lesson 1 (lessons/01-continuous-batching.md) and its notebook "
        "(notebooks/01-continuous-batching.ipynb); `serving-lab demo --list` shows one demo per lesson.",
    ]


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

    print("2/4 this machine's calibrated profile (saved after the first run; measuring it takes ~2 min) ...")
    profile = load_or_calibrate(loaded)
    print(f"   {profile.name}, fitted {profile.provenance.get('fitted_at', profile.provenance.get('date'))}, "
          f"fit error {profile.provenance.get('fit_mean_abs_error_pct')}%")

    print("3/4 static vs continuous batching, engine and simulator, same workload ...")
    rows = static_vs_continuous(ENGINE_CAPS, Sides(model=loaded, hardware=profile))
    print("4/4 the same question on a simulated H100 with Llama-3.1-8B ...")
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
    ax1.set_ylim(0, 1.3 * max(measured + simulated))  # room above the bars for the legend
    ax1.legend(loc="upper left", ncols=2)
    ax2.plot([r["cap"] for r in gpu], [r["ratio"] for r in gpu], marker="o")
    ax2.set_xscale("log")
    ax2.set_xlabel("output-length cap (exponential outputs, mean 128)")
    ax2.set_ylabel("continuous / static throughput")
    ax2.set_title("Llama-3.1-8B, H100 SXM (simulated, datasheet)")
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
              "Llama-3.1-8B on an H100 (datasheet): 512 requests, 64-token prompts, exponential outputs (mean 128) "
              "capped, max_num_seqs=64 (lesson 1's what-if).", "",
              "| cap | static tok/s | continuous tok/s | continuous / static |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['cap']} | {r['static']:.0f} | {r['continuous']:.0f} | {r['ratio']:.2f}x |" for r in gpu]
    closing = takeaway(rows, gpu, profile)
    lines += ["", "![static vs continuous](static_vs_continuous.png)", "", "## Takeaway", "", *closing, "",
              f"Generated by `serving-lab demo` in {time.perf_counter() - started:.0f} s. "
              "Lesson: lessons/01-continuous-batching.md.", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    print()
    for line in closing:
        print(line)
    print(f"report: {report}")
    return report
