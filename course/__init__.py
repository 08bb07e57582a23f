"""The course's code: one module per lesson, named after the lesson's stem (lessons/NN-<stem>.md,
lessons/exercises/eNN_<stem>.py, notebooks/NN-<stem>.ipynb), holding everything that lesson runs: its
experiments (the same workload through the simulator and the real engine, returned as rows with the
simulator's error), its diagram, and its `serving-lab demo` (`demo(context)`: the headline experiment at sizes
that fit a few minutes on a laptop CPU, side by side with the error, a GPU what-if, one plot).

    orientation.py         lesson 0: `serving-lab demo`, the course overview (lesson 1's experiment as a report)
    continuous_batching.py  lesson 1: the cost of a step, static vs continuous batching, load and capacity
    paged_attention.py     lesson 2: KV arithmetic, allocators, block size, preemption by recompute or swap
    chunked_prefill_and_disaggregation.py  lesson 3: the prefill stall, the token-budget dial, fairness,
                           colocated vs xP+yD, a real 1P+1D pair
    prefix_caching.py      lesson 4: warm-prefix TTFT, hit rates, eviction, tenant isolation, chat
    speculative_decoding.py  lesson 5: speed-ups, batch-size sweeps, draft models, acceptance by temperature
    architecture_map.py    lesson 6: the boxes, and requests traced through a running server
    tuning_knobs.py        lesson 7: sweeps, the Pareto front, SLO picks, numerics, the roofline floor
    claims.py, demo.py, drawing.py   what lessons share: timing claims, the demos' table and plot, the
                           diagrams' boxes and arrows

The course imports the product (`serving_lab`: the engine-and-simulator pairing, calibration, the sweep),
the engine and the simulator; of those, only the command line's `demo` imports the course. So this module is
only the demos' registry (name, lesson, one line): the command line offers the choices without importing the
experiments, and a demo's lesson module is imported when it runs (`demo.run_demo`). A new lesson's code is
one new module here and, for its demo, one line in `DEMOS`.

Lesson: lessons/00-orientation.md#quick-start
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Demo:
    """One lesson's demo: its name on the command line, the lesson section it shows, what it runs."""

    name: str
    lesson: str  # the lesson file and anchor, relative to the repository root
    description: str

    @property
    def module(self) -> str:
        """The lesson's module, whose `demo(context) -> DemoReport` runs it: lessons/NN-<stem>.md is
        course/<stem>.py."""
        stem = PurePosixPath(self.lesson.split("#")[0]).stem.split("-", 1)[1]
        return f"{__name__}.{stem.replace('-', '_')}"


DEMOS: dict[str, Demo] = {demo.name: demo for demo in (
    Demo("batching", "lessons/01-continuous-batching.md#continuous-batching",
         "static vs continuous batching: output throughput as output lengths spread, slots busy per step"),
    Demo("paging", "lessons/02-paged-attention.md#reservation-waste",
         "contiguous vs paged KV allocation in one pool: requests per step, throughput"),
    Demo("scheduler", "lessons/03-chunked-prefill-and-disaggregation.md#the-stall",
         "the prefill stall: a long prompt unchunked vs chunked under a token budget"),
    Demo("prefix", "lessons/04-prefix-caching.md#ttft-and-throughput",
         "a shared system prompt with prefix caching off vs on: TTFT and hits; the same prompt from another tenant"),
    Demo("speculation", "lessons/05-speculative-decoding.md#acceptance-and-speedup",
         "prompt-lookup (n-gram) speculation on a copy task: speed-up and accepted tokens"),
    Demo("serve", "lessons/06-architecture-map.md#one-request-traced",
         "the OpenAI-compatible server traced: one request and a burst, engine core vs simulator"),
    Demo("tuning", "lessons/07-tuning-knobs.md#trusting-the-sweep",
         "a max_num_seqs sweep, engine and simulator: does the simulator rank it right; what two SLOs pick"),
)}


def demo_list() -> str:
    """`serving-lab demo --list`: one aligned line per demo (name, lesson, what it shows)."""
    name_width = max(map(len, DEMOS))
    lesson_width = max(len(d.lesson) for d in DEMOS.values())
    return "\n".join(f"{d.name:<{name_width}}  {d.lesson:<{lesson_width}}  {d.description}" for d in DEMOS.values())
