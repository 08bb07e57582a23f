"""The scheduling policies by name: `EngineConfig(scheduling=name)` picks one, `make_scheduler` builds it.

One table serves both, so a policy defined anywhere (a lesson, a test, a notebook) becomes a knob value by
decorating its class with `@register_scheduler("name")`, with no edit to the core. The core registers
"continuous" and "static" (ref_engine/core/scheduler.py); this module imports nothing, so the config can
validate against the table without importing the schedulers.

Lesson: lessons/01-continuous-batching.md (continuous and static batching).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ref_engine.core.scheduler import Scheduler

SchedulerT = TypeVar("SchedulerT", bound="type[Scheduler]")

SCHEDULERS: dict[str, type[Scheduler]] = {}  # in registration order; the core's two come first


def register_scheduler(name: str) -> Callable[[SchedulerT], SchedulerT]:
    """Class decorator: make a `Scheduler` subclass the policy `EngineConfig(scheduling=name)` selects.
    A name already taken by another class is an error, so a plug-in cannot silently replace a policy."""

    def register(cls: SchedulerT) -> SchedulerT:
        if SCHEDULERS.get(name, cls) is not cls:
            raise ValueError(f"scheduling policy {name!r} is already registered to {SCHEDULERS[name].__qualname__}")
        SCHEDULERS[name] = cls
        return cls

    return register
