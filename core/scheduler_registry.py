"""The schedulers by name: `EngineConfig(scheduling=...)` and `EngineConfig(scheduling_policy=...)` pick one,
`make_scheduler` builds it.

One rule serves both knobs: a name stands for a `Scheduler` subclass, registered by decorating the class
with `@register_scheduler("name")`, so a scheduler defined anywhere (a lesson, a test, a notebook) becomes a
knob value with no edit to the core. The two knobs are two tables of that one registry:
- `SCHEDULERS` (`scheduling`): how batches form. The core registers "continuous" and "static"
  (core/scheduler.py); a plug-in may replace any part of the scheduler.
- `SCHEDULING_POLICIES` (`scheduling_policy`, vLLM's knob), registered with `policy=True`: within continuous
  batching, who is admitted first and whom preemption picks. The core registers "fcfs" (the continuous
  scheduler itself), "priority" (core/priority.py) and "fair" (core/fair.py). A policy
  is a subclass of the continuous scheduler; `make_scheduler` builds it when `scheduling="continuous"`.
This module imports nothing (not even `Scheduler`, for its annotations), so the config can validate names
against the tables and the scheduler can register into them without an import circle.

Lesson: lessons/01-continuous-batching.md (continuous and static batching); scheduling policies in
lessons/03-chunked-prefill-and-disaggregation.md#priority.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

SchedulerT = TypeVar("SchedulerT", bound=type)  # a `Scheduler` subclass

SCHEDULERS: dict[str, type] = {}  # `scheduling` -> Scheduler subclass, in registration order; the core's two first
SCHEDULING_POLICIES: dict[str, type] = {}  # `scheduling_policy` -> Scheduler subclass; "fcfs" first


def register_scheduler(name: str, *, policy: bool = False) -> Callable[[SchedulerT], SchedulerT]:
    """Class decorator: make a `Scheduler` subclass the value `name` of `EngineConfig.scheduling`, or with
    `policy=True` of `EngineConfig.scheduling_policy`. A name already taken by another class is an error, so
    a plug-in cannot silently replace a scheduler."""
    table, knob = (SCHEDULING_POLICIES, "scheduling_policy") if policy else (SCHEDULERS, "scheduling")

    def register(cls: SchedulerT) -> SchedulerT:
        if table.get(name, cls) is not cls:
            raise ValueError(f"{knob} {name!r} is already registered to {table[name].__qualname__}")
        table[name] = cls
        return cls

    return register
