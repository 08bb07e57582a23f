"""`serving-lab demo LESSON`: each lesson's headline experiment, run live in front of a class.

A demo is a thin function over its lesson's module in `serving_lab.experiments`: it runs the experiment the
notebook runs, at sizes that fit a few minutes on a laptop CPU, prints the measured and simulated numbers side
by side with the simulator's error, adds a GPU what-if where the lesson has one (the simulator on a datasheet
profile, with the lessons' model and profile names), and saves one plot. `serving-lab demo` with no lesson is
the course overview (`serving_lab/demo.py`); `serving-lab demo --list` lists the lessons' demos.

This module is only the registry (name, lesson, one line), so that the command line offers the choices
without importing the experiments; a demo's module is imported when it runs (`common.run_demo`).

    common.py       DemoContext (model, profile, sizes), DemoReport, side_by_side, the plot, run_demo
    batching.py     lesson 1: static vs continuous batching
    paging.py       lesson 2: contiguous vs paged KV allocation
    scheduler.py    lesson 3: the prefill stall, unchunked vs chunked
    prefix.py       lesson 4: a shared system prompt, prefix caching off vs on
    speculation.py  lesson 5: prompt-lookup speculation on a copy task
    serve.py        lesson 6: the OpenAI server, one request and a burst traced
    tuning.py       lesson 7: a max_num_seqs sweep, ranked by the engine and the simulator

Lesson: lessons/00-orientation.md#quick-start
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Demo:
    """One lesson's demo: its name on the command line, the lesson section it shows, what it runs."""

    name: str
    lesson: str  # the lesson file and anchor, relative to the repository root
    description: str

    @property
    def module(self) -> str:
        """The module whose `run(context) -> DemoReport` runs it."""
        return f"{__name__}.{self.name}"


DEMOS: dict[str, Demo] = {demo.name: demo for demo in (
    Demo("batching", "lessons/01-continuous-batching.md#continuous-batching",
         "static vs continuous batching: output throughput as output lengths spread"),
    Demo("paging", "lessons/02-paged-attention.md#reservation-waste",
         "contiguous vs paged KV allocation in one pool: requests per step, throughput"),
    Demo("scheduler", "lessons/03-chunked-prefill-and-disaggregation.md#the-stall",
         "the prefill stall: a long prompt unchunked vs chunked under a token budget"),
    Demo("prefix", "lessons/04-prefix-caching.md#ttft-and-throughput",
         "a shared system prompt with prefix caching off vs on: TTFT and hits"),
    Demo("speculation", "lessons/05-speculative-decoding.md#acceptance-and-speedup",
         "prompt-lookup (n-gram) speculation on a copy task: speed-up and accepted tokens"),
    Demo("serve", "lessons/06-architecture-map.md#one-request-traced",
         "the OpenAI-compatible server traced: one request and a burst, engine core vs simulator"),
    Demo("tuning", "lessons/07-tuning-knobs.md#trusting-the-sweep",
         "a max_num_seqs sweep on the engine and in the simulator: does the simulator rank it right"),
)}


def demo_list() -> str:
    """`serving-lab demo --list`: one aligned line per demo (name, lesson, what it shows)."""
    name_width = max(map(len, DEMOS))
    lesson_width = max(len(d.lesson) for d in DEMOS.values())
    return "\n".join(f"{d.name:<{name_width}}  {d.lesson:<{lesson_width}}  {d.description}" for d in DEMOS.values())
