"""Lesson 4: prefix caching (warm-prefix TTFT, hit rates, eviction, tenant isolation, chat).

`hash_chain` draws the hash chain; `demo` is `serving-lab demo prefix`.

Lesson: lessons/04-prefix-caching.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.config import EngineConfig
from core.workload import LengthSpec, Workload
from course.demo import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from course.drawing import COLORS, arrow, box, canvas
from serving_lab.pairing import Job, Sides, paired_rows, pairs


def _prefix_config(block_size: int, caching: bool, num_kv_blocks: int, max_num_seqs: int = 16,
                   max_num_batched_tokens: int = 2048) -> EngineConfig:
    return EngineConfig(block_size=block_size, enable_prefix_caching=caching, num_kv_blocks=num_kv_blocks,
                        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)


def _warmup(num_groups: int, prefix_len: int, suffix_len: LengthSpec, seed: int) -> Workload:
    """One request per group of `Workload.shared_prefix(num_groups, ..., seed=seed)`: the group's prefix,
    another suffix, one output token. Served first, it leaves the prefixes cached for the measured run."""
    return Workload.shared_prefix(num_groups, 1, prefix_len, suffix_len, 1, seed=seed + 1, prefix_seed=seed,
                                  name="warm-up")


def _with_hits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark each simulated row paired with a measured one: did both sides hit the same number of tokens?"""
    for measured, simulated in pairs(rows):
        simulated["same_hits"] = measured["prefix_cache_hits"] == simulated["prefix_cache_hits"]
    return rows


def shared_prefix_ttft(prefix_lens: Iterable[int], sides: Sides, *, num_groups: int = 1,
                       requests_per_group: int = 8, suffix_len: LengthSpec = 50, output_len: LengthSpec = 16,
                       block_size: int = EngineConfig.block_size, num_kv_blocks: int = 512,
                       max_num_batched_tokens: int = 2048, seed: int = 0) -> list[dict[str, Any]]:
    """A shared system prompt of each length in `prefix_lens`, cache off vs on (lesson 4, "ttft-and-throughput").

    One request per group warms the cache first (not measured); then `requests_per_group` requests per
    group, each the group's prefix plus its own `suffix_len`-token question, arrive at once. With caching
    they skip the prefix's full blocks, so TTFT falls and throughput rises in proportion to the prefill
    skipped. Rows: (prefix_len, caching) x (measured, simulated), with `prefix_cache_hit_rate` and, on
    simulated rows, `same_hits` (the core decides hits, so they must be equal)."""
    jobs = []
    for prefix_len in prefix_lens:
        warmup = _warmup(num_groups, prefix_len, suffix_len, seed)
        workload = Workload.shared_prefix(num_groups, requests_per_group, prefix_len, suffix_len, output_len,
                                          seed=seed, name=f"prefix-{prefix_len}")
        for caching in (False, True):
            config = _prefix_config(block_size, caching, num_kv_blocks,
                                    max_num_batched_tokens=max_num_batched_tokens)
            jobs.append(Job(workload, config, {"prefix_len": prefix_len, "caching": caching},
                             warmup=(warmup,)))
    return _with_hits(paired_rows(jobs, sides))


def hit_rate_sweep(prefix_lens: Iterable[int], block_sizes: Iterable[int], *, requests_per_group: int = 8,
                   suffix_len: int = 50, seed: int = 0) -> list[dict[str, Any]]:
    """Simulated hit rate after a warm-up, for each shared-prefix length and block size, next to the
    formula: only whole blocks hit, so hits = min(floor(prefix_len / block_size) * block_size, prompt_len - 1)
    per request. A prefix shorter than one block never hits. (The core decides hits: no engine run is needed
    to know them.)"""
    rows = []
    for block_size in block_sizes:
        for prefix_len in prefix_lens:
            warmup = _warmup(1, prefix_len, suffix_len, seed)
            workload = Workload.shared_prefix(1, requests_per_group, prefix_len, suffix_len, 4, seed=seed)
            config = _prefix_config(block_size, True, num_kv_blocks=4096 // block_size + 64)
            metrics = Sides(measure=False).simulator(config).run_rounds([warmup, workload])[-1]
            prompt_len = prefix_len + suffix_len  # the last token is always computed (its block copied)
            predicted = min((prefix_len // block_size) * block_size, prompt_len - 1) / prompt_len
            rows.append({"block_size": block_size, "prefix_len": prefix_len,
                         "hit_rate": metrics.prefix_cache_hit_rate, "predicted_hit_rate": predicted})
    return rows


def eviction_sweep(num_groups_list: Iterable[int], sides: Sides, *, prefix_len: int = 64, suffix_len: int = 8,
                   num_rounds: int = 3, num_kv_blocks: int = 32, block_size: int = EngineConfig.block_size,
                   measure_groups: Iterable[int] = (), seed: int = 0) -> list[dict[str, Any]]:
    """Eviction under memory pressure: `num_groups` prefixes take turns (one request each per round) in a
    pool of `num_kv_blocks` blocks. While every prefix fits, rounds after the first hit; once they do not,
    least-recently-used eviction throws out each prefix just before it is needed again, and the hit rate of
    the last round collapses to zero: LRU's cliff. Measured only for groups in `measure_groups`."""
    measure = set(measure_groups)
    jobs = []
    for num_groups in num_groups_list:
        # the same seed every round: each group sends the same prompt again, one round after another
        rounds = [Workload.shared_prefix(num_groups, 1, prefix_len, suffix_len, 4, seed=seed)] * num_rounds
        config = _prefix_config(block_size, True, num_kv_blocks, max_num_seqs=1)
        jobs.append(Job(rounds[-1], config, {"num_groups": num_groups,
                                              "prefix_blocks": num_groups * (prefix_len // block_size)},
                         measure=num_groups in measure, warmup=tuple(rounds[:-1])))
    return _with_hits(paired_rows(jobs, sides))


def tenant_isolation(sides: Sides, *, prefix_len: int = 512, suffix_len: int = 16, output_len: int = 8,
                     block_size: int = EngineConfig.block_size, num_kv_blocks: int = 256, seed: int = 0
                     ) -> list[dict[str, Any]]:
    """Tenant A sends a prompt; then the same prompt arrives from A again, from tenant B, and from A with a
    `cache_salt`. Only A's unsalted repeat may hit: B must see a cold TTFT, or B could learn from timing
    alone that someone already sent that prompt (the side channel)."""
    warmup = _warmup(1, prefix_len, suffix_len, seed).with_tenant("A")
    probe = Workload.shared_prefix(1, 1, prefix_len, suffix_len, output_len, seed=seed, name="probe")
    config = _prefix_config(block_size, True, num_kv_blocks)
    senders = {"A": ("A", None), "B": ("B", None), "A, salted": ("A", "s1")}
    jobs = [Job(probe.with_tenant(*who), config, {"sender": label}, warmup=(warmup,))
            for label, who in senders.items()]
    return _with_hits(paired_rows(jobs, sides))


def chat_replay(sides: Sides, *, num_conversations: int = 4, num_turns: int = 3, first_prompt_len: int = 128,
                turn_len: int = 96, output_len: int = 16, block_size: int = EngineConfig.block_size,
                num_kv_blocks: int = 512, seed: int = 0) -> list[dict[str, Any]]:
    """Multi-turn chat: turn k of every conversation, after turns 1..k-1 ran on the same engine, cache off
    vs on. Each turn resends the whole history, so without caching TTFT grows with the conversation; with
    it, only the new message (and the partial block before it) is prefilled."""
    rounds = Workload.chat_rounds(num_conversations, num_turns, first_prompt_len, turn_len, output_len, seed=seed)
    jobs = [Job(rounds[k], _prefix_config(block_size, caching, num_kv_blocks), {"turn": k + 1, "caching": caching},
                 warmup=tuple(rounds[:k]))
            for k in range(num_turns) for caching in (False, True)]
    return _with_hits(paired_rows(jobs, sides))


# ---- the diagram ----


def hash_chain():
    """Lesson 4: each full block's hash chains its parent's, so a hit on block i means blocks 0..i all match."""
    fig, ax = canvas(11, 4.2, (0, 12), (0, 5))
    y = {"first request": 3.6, "second request": 1.5}
    for label, row in y.items():
        ax.text(0.1, row + 0.75, label, fontsize=9, weight="bold")
    first = [box(ax, 1.6 + 2.6 * i, y["first request"], text, COLORS[0] if i < 2 else "white", fontsize=7.5)
             for i, text in enumerate(["system prompt\ntokens 0-15\nh0 = H(None, t0..15)",
                                       "system prompt\ntokens 16-31\nh1 = H(h0, t16..31)",
                                       "question A\ntokens 32-47\nh2 = H(h1, t32..47)",
                                       "tokens 48-50\n(partial block:\nnot hashed)"])]
    second = [box(ax, 1.6 + 2.6 * i, y["second request"], text, COLORS[2] if i < 2 else "white", fontsize=7.5)
              for i, text in enumerate(["same 16 tokens\nh0: hit", "same 16 tokens\nh1: hit",
                                        "question B\nh2' != h2: miss", "..."])]
    for row in (first, second):
        for a, b in zip(row, row[1:]):
            arrow(ax, a, b, "parent", fontsize=7)
    for a, b in zip(first[:2], second[:2]):
        arrow(ax, a, b, "", color="#2a7", linestyle="dashed")
    ax.text(6.0, 0.3, "cached blocks are found by hash; the second request's prefill starts at token 32 "
            "(extra keys such as cache_salt enter h0)", ha="center", fontsize=8, color="#555")
    ax.set_title("Prefix caching: a hash chain over full blocks", fontsize=11)
    fig.tight_layout()
    return fig


# ---- the demo (serving-lab demo) ----

DEMO_PRESETS = {
    "full": dict(prefix_lens=(0, 128, 256), repeats=2, requests_per_group=4, suffix_len=32, output_len=4),
    "fast": dict(prefix_lens=(0, 32), repeats=1, requests_per_group=2, suffix_len=8, output_len=2, num_kv_blocks=32),
}
TENANT_PRESETS = {  # the side-channel beat: one prompt of a shared prefix, sent after tenant A warmed it
    "full": dict(prefix_len=256, suffix_len=16, output_len=8),  # notebook 04's fast-mode tenant run
    "fast": dict(prefix_len=64, suffix_len=8, output_len=2, num_kv_blocks=32),
}
GPU_PREFIX_LENS = (0, 512, 1024, 2048)
GPU_TTFT = dict(requests_per_group=16, suffix_len=50, output_len=64, num_kv_blocks=8192)  # as notebook 04's
GPU_TENANT = dict(prefix_len=2048, suffix_len=50, output_len=64, num_kv_blocks=8192)


def demo(context: DemoContext) -> DemoReport:
    """Requests sharing a system prompt, with prefix caching off and on, after one warm-up
    request (`shared_prefix_ttft`). The core decides the hits, so both sides hit the same tokens; with the cache
    warm, TTFT stops growing with the prefix. Then the side channel (`tenant_isolation`): after tenant A's
    request, the same prompt from A hits, from tenant B (or from A with a `cache_salt`) it is cold, because the
    isolation key is in every block's hash. Last, the same on a simulated H100 with the papers' prefix lengths."""
    p = dict(context.preset(DEMO_PRESETS))
    sides = context.sides(p.pop("repeats"))
    rows = shared_prefix_ttft(p.pop("prefix_lens"), sides, **p)
    tenant = context.preset(TENANT_PRESETS)
    tenants = tenant_isolation(sides, **tenant)
    for row in tenants:  # placed in the table beside the shared-prefix rows: a warm cache, one prompt
        row.update(prefix_len=tenant["prefix_len"], caching=True)
    gpu = {(r["prefix_len"], r["caching"]): r for r in shared_prefix_ttft(GPU_PREFIX_LENS, GPU, **GPU_TTFT)}
    gpu_tenants = {r["sender"]: r for r in tenant_isolation(GPU, **GPU_TENANT)}
    labels = ("prefix_len", "caching", "sender")
    comparison = (side_by_side(rows, labels, ("mean_ttft_ms", "prefix_cache_hits"))
                  + side_by_side(tenants, labels, ("mean_ttft_ms", "prefix_cache_hits")))
    figure, (what_if,) = plot_comparison(comparison, labels, f"{p['requests_per_group']} requests sharing a system "
                                         "prompt, prefix caching off vs on; then one prompt from tenant A, B and A "
                                         "salted (hits: decided by the core)")
    for caching in (False, True):
        what_if.plot(GPU_PREFIX_LENS, [gpu[(n, caching)]["mean_ttft_ms"] for n in GPU_PREFIX_LENS], "o-",
                     label=f"caching {'on' if caching else 'off'}")
    what_if.set(xlabel="shared prefix (tokens)", ylabel="mean TTFT (ms)", title=gpu_name())
    what_if.legend(fontsize=7)
    longest = GPU_PREFIX_LENS[-1]
    cold, warm = gpu[(longest, False)], gpu[(longest, True)]
    measured = {r["sender"]: r for r in tenants if r["side"] == "measured"}
    return DemoReport(comparison, labels, figure, notes=[
        f"side channel: after tenant A's request, the same {tenant['prefix_len']}-token prefix from "
        + ", ".join(f"{who}: TTFT {measured[who]['mean_ttft_ms']:.0f} ms measured, "
                    f"{measured[who]['prefix_cache_hits']} tokens hit" for who in measured)
        + " (B and the salted prompt are cold: the tenant and the salt are in every block's hash, so B cannot "
          "time A's prompts)",
        f"GPU what-if, {gpu_name()}: a warm {longest}-token prefix cuts mean TTFT {cold['mean_ttft_ms']:.0f} -> "
        f"{warm['mean_ttft_ms']:.0f} ms and raises output throughput "
        f"{warm['output_throughput'] / cold['output_throughput']:.2f}x "
        f"({GPU_TTFT['requests_per_group']} requests, {GPU_TTFT['suffix_len']}-token questions); tenant A's repeat "
        f"{gpu_tenants['A']['mean_ttft_ms']:.0f} ms, tenant B {gpu_tenants['B']['mean_ttft_ms']:.0f} ms",
    ])
