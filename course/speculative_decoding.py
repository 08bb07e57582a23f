"""Lesson 5: speculative decoding (measured and replayed speed-ups, the batch-size sweeps
measured and simulated, acceptance by temperature, a draft model on a simulated GPU).

`propose_verify` draws one speculative step; `demo` is `serving-lab demo speculation`.

Lesson: lessons/05-speculative-decoding.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median
from typing import Any

from core.config import EngineConfig
from core.math_utils import cdiv
from core.metrics import RunMetrics, spec_decode_counts
from core.workload import Workload
from course.demo import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from course.drawing import COLORS, canvas, cell_row
from serving_lab.pairing import Sides, machine_slowdown, metrics_row
from sim.cost_model import BatchShape, CostModel
from sim.simulator import Simulator
from sim.spec_decode import AcceptanceRate, AcceptanceReplay, expected_tokens_per_step

CHAT_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # SmolLM2's, for one user turn

# Input-grounded tasks: the answer copies the prompt, which is what prompt lookup exploits. The texts are
# fixed here (not read from this repository's files, which change), so measurements stay comparable.
GROUNDED_TEXTS = (
    "The cache keeps the keys and values of every token the model has already seen. When a new token arrives,\n"
    "the model only computes the keys and values of that one token and reads the rest from the cache. This is\n"
    "why generating each new token is cheap compared with reading the whole prompt, and why the cache grows by\n"
    "one entry per layer for every token that the model produces.",
    "def fibonacci(n: int) -> list[int]:\n"
    '    """The first n Fibonacci numbers."""\n'
    "    numbers = [0, 1]\n"
    "    while len(numbers) < n:\n"
    "        numbers.append(numbers[-1] + numbers[-2])\n"
    "    return numbers[:n]\n\n\n"
    "def is_prime(n: int) -> bool:\n"
    '    """True when n has no divisor between 2 and its square root."""\n'
    "    if n < 2:\n"
    "        return False\n"
    "    for d in range(2, int(n ** 0.5) + 1):\n"
    "        if n % d == 0:\n"
    "            return False\n"
    "    return True\n",
    "A library lends books to its members. Each member may borrow up to five books at a time, for three\n"
    "weeks each. A book that comes back late costs ten cents for every day it is late. Members can renew a\n"
    "book once, online or at the desk, unless another member has reserved it. Reserved books wait at the desk\n"
    "for one week before they go back to the shelf.",
    "def word_counts(text: str) -> dict[str, int]:\n"
    '    """How often each word occurs in text, ignoring case."""\n'
    "    counts: dict[str, int] = {}\n"
    "    for word in text.lower().split():\n"
    "        counts[word] = counts.get(word, 0) + 1\n"
    "    return counts\n",
)
COPY_INSTRUCTIONS = ("Copy the following text exactly:", "Repeat the following exactly, line by line:")


def grounded_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """`n` chat prompts asking the model to copy a fixed text (texts, then wordings, cycle), as token ids."""
    return [tokenizer.encode(CHAT_TEMPLATE.format(
        f"{COPY_INSTRUCTIONS[(i // len(GROUNDED_TEXTS)) % len(COPY_INSTRUCTIONS)]}\n\n"
        f"{GROUNDED_TEXTS[i % len(GROUNDED_TEXTS)]}")) for i in range(n)]


def speculation(prompts: list[list[int]], configs: dict[str, EngineConfig], sides: Sides, *, output_len: int = 64,
                acceptance: Any = None, **labels: Any) -> list[dict[str, Any]]:
    """Each configuration on the same greedy prompts: [measured, simulated] rows (or only simulated).

    A measured speculative run is simulated with its own per-step counts replayed (`AcceptanceReplay`), so
    the two sides make the same decisions and differ only in time; without the engine, `acceptance` (an
    `AcceptanceModel`) stands in for the proposer. Rows carry `config` (the label) and, when measured, the
    engine's output token ids under "token_ids" so a notebook can check greedy outputs are unchanged."""
    workload = Workload.from_token_ids(prompts, output_len, name="speculation")
    rows = []
    for label, config in configs.items():
        row_labels = {**labels, "config": label, "batch": len(prompts)}

        def simulate(acc: Any, cfg: EngineConfig = config) -> RunMetrics:
            return Simulator(sides.simulated_arch(), sides.hardware, cfg, dtype=sides.dtype,
                             acceptance=acc if cfg.speculative_method else None).run(workload)

        if not sides.measure:
            rows.append(metrics_row(simulate(acceptance), "simulated", row_labels))
            continue
        # The engine (torch) is imported only where a measured side needs it: simulator-only sweeps run without.
        from ref_engine import bench

        runs = [bench.run(workload, config, model=sides.model) for _ in range(sides.repeats)]
        measured = min(runs, key=lambda m: m.duration)
        rows.append({**metrics_row(measured, "measured", row_labels), "slowdown": machine_slowdown(measured, sides)})
        rows.append(metrics_row(simulate(AcceptanceReplay(measured.steps)), "simulated", row_labels, measured))
    return rows


def speedups(rows: Iterable[dict[str, Any]], baseline: str = "off", by: tuple[str, ...] = ("side",)
             ) -> dict[tuple[Any, ...], float]:
    """output_throughput of each (config, *by) row over the `baseline` config's with the same `by` values."""
    rows = list(rows)
    base = {tuple(r[k] for k in by): r["output_throughput"] for r in rows if r["config"] == baseline}
    return {(r["config"], *(r[k] for k in by)): r["output_throughput"] / base[tuple(r[k] for k in by)]
            for r in rows if r["config"] != baseline}


def speculation_batch_sweep(batch_sizes: Iterable[int], acceptance_rate: float, sides: Sides, *, k: int = 5,
                            prompt_len: int = 128, output_len: int = 128) -> list[dict[str, Any]]:
    """Simulated speed-up of speculation (threshold off) over plain decoding as the batch grows, at a fixed
    acceptance rate: where memory-bound decode turns compute-bound, verifying k drafts stops being free.

    Each row also carries `verify_cost`: the cost model's price of a verify step (every request checking k
    drafts) over that of a plain decode step, at this batch and the prompt's context. While decode steps
    dominate a run, the speed-up is about tokens_per_step / verify_cost, so the two columns say why it falls."""
    cost_model = sides.cost_model()
    rows = []
    for batch in batch_sizes:
        workload = Workload.synthetic(batch, prompt_len, output_len, seed=batch)
        config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(512, batch * (k + 1)),
                              num_kv_blocks=batch * cdiv(prompt_len + output_len + k, EngineConfig.block_size) + 1)
        plain = sides.simulator(config).run(workload)
        spec_config = config.replace(speculative_method="ngram", num_speculative_tokens=k,
                                     speculative_disable_by_batch_size=None)
        spec = Simulator(sides.simulated_arch(), sides.hardware, spec_config, dtype=sides.dtype,
                         acceptance=AcceptanceRate((acceptance_rate,), seed=batch)).run(workload)
        rows.append({"batch": batch, "plain_tok_s": plain.output_throughput, "spec_tok_s": spec.output_throughput,
                     "speedup": spec.output_throughput / plain.output_throughput,
                     "tokens_per_step": spec.mean_acceptance_length,
                     "verify_cost": priced_verify_cost(cost_model, batch, prompt_len, k)})
    return rows


def priced_verify_cost(cost_model: CostModel, batch: int, context_len: int, k: int) -> float:
    """The cost model's price of a verify step (every request checking k drafts) over that of a plain decode
    step, at this batch and context."""
    return (cost_model.step_time(BatchShape.verify(batch, context_len, k))
            / cost_model.step_time(BatchShape.decode(batch, context_len)))


def measured_batch_sweep(tokenizer: Any, batch_sizes: Iterable[int], sides: Sides, *, output_len: int = 48,
                         k: int = EngineConfig.num_speculative_tokens) -> list[dict[str, Any]]:
    """Prompt lookup against no speculation on `batch` input-grounded prompts at once, for each batch size,
    on both sides (`speculation`'s rows, labelled with `batch`). The threshold is off, so every request
    speculates however big the batch: the engine's own speed-up curve, next to the simulated one."""
    configs = {"off": EngineConfig(),
               "ngram": EngineConfig(speculative_method="ngram", num_speculative_tokens=k,
                                     speculative_disable_by_batch_size=None)}
    rows: list[dict[str, Any]] = []
    for batch in batch_sizes:
        rows += speculation(grounded_prompts(tokenizer, batch), configs, sides, output_len=output_len)
    return rows


def acceptance_by_temperature(model: Any, prompts: list[list[int]], temperatures: Iterable[float], *,
                              output_len: int = 48, k: int = EngineConfig.num_speculative_tokens,
                              seed: int = 0) -> list[dict[str, Any]]:
    """Prompt lookup on the engine at each sampling temperature (seeded; 0 is greedy): how many drafts the
    verifier accepts, overall and by draft position, and the tokens a verify step emits. A prompt-lookup
    draft is a point mass, so a sampled request accepts draft x with probability p(x), which a higher
    temperature lowers for the likely tokens that prompt lookup proposes."""
    from ref_engine import LLM, SamplingParams  # the engine (torch) only where it runs

    llm = LLM(model, speculative_method="ngram", num_speculative_tokens=k)
    rows = []
    for temperature in temperatures:
        llm.llm_engine.step_records.clear()
        params = [SamplingParams(max_tokens=output_len, temperature=temperature, seed=seed + i, ignore_eos=True)
                  for i in range(len(prompts))]
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        counts = spec_decode_counts(llm.llm_engine.step_records)
        rows.append({"temperature": temperature, "num_verifies": counts.get("num_drafts", 0),
                     "num_draft_tokens": counts.get("num_draft_tokens", 0),
                     "num_accepted_tokens": counts.get("num_accepted_tokens", 0),
                     "acceptance_rate": counts.get("draft_acceptance_rate", 0.0),
                     "tokens_per_verify": counts.get("mean_acceptance_length", 1.0),
                     "acceptance_by_position": counts.get("acceptance_by_position", ())})
    return rows


def draft_model_sweep(batch_sizes: Iterable[int], acceptance_rates: Iterable[float], *,
                      target: str = "llama-3.1-70b", draft: str = "llama-3.1-8b", hardware: str = "h100-sxm",
                      tensor_parallel_size: int = 4, k: int = 4, prompt_len: int = 512,
                      output_len: int = 128) -> list[dict[str, Any]]:
    """Simulated speed-up of a separate draft model over plain decoding (threshold off), per batch size and
    assumed acceptance rate: the target and the draft both sharded over `tensor_parallel_size` devices, the
    draft's k passes per step priced on its own dims (`DraftCostTimer`). Each row also carries `draft_cost`
    (c: one draft pass over one plain target step, at this batch and context), `verify_cost` (the target's
    verify step over a plain one) and `predicted` = tokens_per_step / (verify_cost + k c), the formula the
    simulated speed-up follows while decode steps dominate the run."""
    target_cost = Simulator(target, hardware, EngineConfig(num_kv_blocks=1), tensor_parallel_size=tensor_parallel_size
                            ).cost_model
    draft_cost = Simulator(draft, hardware, EngineConfig(num_kv_blocks=1), tensor_parallel_size=tensor_parallel_size
                           ).cost_model
    rows = []
    for batch in batch_sizes:
        workload = Workload.synthetic(batch, prompt_len, output_len, seed=batch)
        config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(2048, batch * (k + 1)),
                              num_kv_blocks=batch * cdiv(prompt_len + output_len + k, EngineConfig.block_size) + 1)
        plain = Simulator(target, hardware, config, tensor_parallel_size=tensor_parallel_size).run(workload)
        c = (draft_cost.step_time(BatchShape.decode(batch, prompt_len))
             / target_cost.step_time(BatchShape.decode(batch, prompt_len)))
        verify = priced_verify_cost(target_cost, batch, prompt_len, k)
        for a in acceptance_rates:
            spec_config = config.replace(speculative_method="draft_model", speculative_model=draft,
                                         num_speculative_tokens=k, speculative_disable_by_batch_size=None)
            spec = Simulator(target, hardware, spec_config, tensor_parallel_size=tensor_parallel_size,
                             acceptance=AcceptanceRate((a,), seed=batch)).run(workload)
            rows.append({"batch": batch, "acceptance_rate": a, "plain_tok_s": plain.output_throughput,
                         "spec_tok_s": spec.output_throughput,
                         "speedup": spec.output_throughput / plain.output_throughput,
                         "tokens_per_step": spec.mean_acceptance_length, "draft_cost": c, "verify_cost": verify,
                         "predicted": expected_tokens_per_step(a, k) / (verify + k * c)})
    return rows


def measured_verify_cost(plain: RunMetrics, spec: RunMetrics, k: int = EngineConfig.num_speculative_tokens
                         ) -> float:
    """What the engine paid for a verify step of k drafts, in plain decode steps: the median duration of
    `spec`'s steps in which every request ran 1 + k tokens over the median of `plain`'s steps in which every
    request ran one token (two runs of the same prompts, so the same batch and similar contexts). Compare it
    with `speculation_batch_sweep`'s `verify_cost`, the profile's price of the same step."""
    verify = [s.duration for s in spec.steps if s.query_lens and all(q == k + 1 for q in s.query_lens)]
    decode = [s.duration for s in plain.steps if s.query_lens and all(q == 1 for q in s.query_lens)]
    if not verify or not decode:
        raise ValueError("need steps in which every request verified k drafts, and plain decode steps")
    return median(verify) / median(decode)


# ---- the diagram ----


def propose_verify(k: int = 4, accepted: int = 2):
    """Lesson 5: a proposer drafts k tokens, one target pass scores k + 1 positions, the longest agreeing prefix
    is kept plus one token from the target, so every step emits between 1 and k + 1 tokens."""
    fig, ax = canvas(11, 3.8, (0, 12), (0, 4.6))
    ax.text(0.1, 3.9, f"1. propose (n-gram lookup, a draft model, EAGLE/Medusa heads): {k} draft tokens",
            fontsize=9)
    cell_row(ax, 0.4, 3.1, ["context", *[f"d{i + 1}" for i in range(k)]], ["#eee", *[COLORS[3]] * k], width=1.1)
    ax.text(0.1, 2.4, f"2. verify: one target forward over the last token + {k} drafts scores {k + 1} positions",
            fontsize=9)
    marks = ["ok"] * accepted + ["reject"] + ["-"] * (k - accepted - 1)
    colors = [COLORS[2]] * accepted + ["#f4cccc"] + ["#eee"] * (k - accepted - 1)
    cell_row(ax, 1.5, 1.6, marks, colors, width=1.1)
    ax.text(0.1, 0.9, f"3. emit d1..d{accepted} and the target's own token at position {accepted + 1} "
            f"({accepted + 1} tokens this step); the rejected drafts' KV slots are given back", fontsize=9)
    cell_row(ax, 1.5, 0.1, [*[f"d{i + 1}" for i in range(accepted)], "t*"], [COLORS[2]] * accepted + [COLORS[0]],
             width=1.1)
    ax.set_title("Speculative decoding: propose k, verify in one pass, keep the agreeing prefix + 1", fontsize=11)
    fig.tight_layout()
    return fig


# ---- the demo (serving-lab demo) ----

DEMO_PRESETS = {"full": dict(output_len=48, repeats=2, gpu_batches=(1, 8, 64, 256)),
           "fast": dict(output_len=8, repeats=1, gpu_batches=(1, 16))}
CONFIGS = {"off": EngineConfig(), "ngram": EngineConfig(speculative_method="ngram")}
GPU_ACCEPTANCE = 0.5  # the chance a draft token is accepted, as notebook 05's sweep assumes


def demo(context: DemoContext) -> DemoReport:
    """Prompt-lookup (n-gram) speculation on a copy task, on the engine and in the simulator
    (`speculation`). The simulator replays the engine's accepted drafts, so both sides take the same steps and
    accept the same tokens; whether the speed-up survives is this machine's price of a verify step. Then the
    batch-size sweep on a simulated H100, where the speed-up fades as decode turns compute-bound."""
    p = context.preset(DEMO_PRESETS)
    prompts = grounded_prompts(context.model.tokenizer, 1)
    rows = speculation(prompts, CONFIGS, context.sides(p["repeats"]), output_len=p["output_len"])
    speedup = speedups(rows)
    gpu = speculation_batch_sweep(p["gpu_batches"], GPU_ACCEPTANCE, GPU)
    labels = ("config",)
    comparison = side_by_side(rows, labels, ("output_throughput", "num_steps", "num_accepted_tokens"))
    figure, (what_if,) = plot_comparison(comparison, labels, "prompt lookup on \"copy this text\" "
                                         "(steps and accepted tokens: the engine's, replayed)")
    what_if.plot([r["batch"] for r in gpu], [r["speedup"] for r in gpu], "o-")
    what_if.axhline(1, color="grey", lw=0.8)
    what_if.set(xscale="log", xlabel="batch size", ylabel="speed-up",
                title=f"{gpu_name()}, acceptance {GPU_ACCEPTANCE}")
    return DemoReport(comparison, labels, figure, notes=[
        f"speed-up of ngram over off: measured {speedup[('ngram', 'measured')]:.2f}x, "
        f"simulated {speedup[('ngram', 'simulated')]:.2f}x",
        f"GPU what-if, {gpu_name()}: at acceptance {GPU_ACCEPTANCE}, speed-up "
        + ", ".join(f"{r['speedup']:.2f}x at batch {r['batch']}" for r in gpu),
    ])
