"""Lesson 5's experiments: speculative decoding (measured and replayed speed-ups, the batch-size sweep).

Lesson: lessons/05-speculative-decoding.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ref_engine.core.config import EngineConfig
from ref_engine.core.math_utils import cdiv
from ref_engine.core.metrics import RunMetrics
from ref_engine.core.workload import Workload
from serving_lab.experiments.common import Sides, machine_slowdown, metrics_row
from sim.cost_model import BatchShape
from sim.simulator import Simulator
from sim.spec_decode import AcceptanceRate, AcceptanceReplay

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
                     "verify_cost": cost_model.step_time(BatchShape((k + 1,) * batch, (prompt_len,) * batch,
                                                                    num_logit_rows=(k + 1) * batch))
                     / cost_model.step_time(BatchShape.decode(batch, prompt_len))})
    return rows

