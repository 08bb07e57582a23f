"""`Trace`: a production trace as data, what a real service was sent: when each request arrived and how many
tokens it brought and asked for.

The published traces keep no text, only counts: one row per request, in arrival order, with its arrival
time, its prompt length and its output length. That is all a serving run needs to meet a real service's
bursts and lulls and its mix of short and long requests (`Workload.replay` plays a trace; prompts are
seeded random ids). `read_trace` reads Azure's CSV format, `TIMESTAMP,ContextTokens,GeneratedTokens`,
plain or gzipped, after optional `#` comment lines, and names the file and line of anything it cannot use;
`load_trace` finds a trace shipped in core/data by name (`TRACE_FILES`, Azure's two 2023 traces in full)
or reads a file.

Invariants: a trace holds at least one request; arrival times are seconds after the first request, so the
first is 0, and never decrease; every prompt and every output has at least one token; the three tuples
have one entry per request.

Lesson: lessons/07-tuning-knobs.md (a grid priced on a production trace).
"""

from __future__ import annotations

import functools
import gzip
import itertools
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"  # Azure's columns: arrival, prompt and output tokens

# The traces shipped in core/data, by name: Azure's 2023 LLM inference traces, an hour each, in full (each
# file's comment says where it comes from). They stay out of the browser's playgrounds, which draw lengths
# from core/workload.py's small samples of them (`TRACES`, the same names) instead.
TRACE_FILES = {
    "azure-conv-2023": "azure-llm-2023-conv-full.csv.gz",  # a chat service: 19,366 requests in 58 minutes
    "azure-code-2023": "azure-llm-2023-code-full.csv.gz",  # code completion: 8,819 requests in 57 minutes
}

# Azure writes "2023-11-16 18:15:46.6805900": 100 ns digits, which `datetime.fromisoformat` reads only from
# Python 3.11; the fraction is cut to microseconds instead.
_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:\.(\d+))?")


@dataclass(frozen=True)
class Trace:
    """The requests of a production trace, in arrival order (invariants: the module's docstring)."""

    name: str
    source: str  # where it comes from: the file's `#` comment (origin, licence, paper), else its path
    arrival_times: tuple[float, ...]  # seconds after the first request
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = {len(self.arrival_times), len(self.prompt_lens), len(self.output_lens)}
        if len(sizes) != 1 or not self.arrival_times:
            raise ValueError(f"trace {self.name!r}: arrival_times, prompt_lens and output_lens need one "
                             f"entry per request, at least one, got {sorted(sizes)}")
        times = self.arrival_times
        if times[0] != 0 or any(later < earlier for earlier, later in zip(times, times[1:])):
            raise ValueError(f"trace {self.name!r}: arrival_times must start at 0 and never decrease")
        if min(self.prompt_lens) < 1 or min(self.output_lens) < 1:
            raise ValueError(f"trace {self.name!r}: every prompt and output needs at least one token")

    def __len__(self) -> int:
        return len(self.arrival_times)

    @property
    def duration(self) -> float:
        """Seconds from the first request to the last."""
        return self.arrival_times[-1]

    @property
    def mean_interarrival(self) -> float:
        """The mean gap between two requests (0 for a single one): what separates two passes of a loop."""
        return self.duration / (len(self) - 1) if len(self) > 1 else 0.0


def read_trace(path: str | Path, name: str | None = None) -> Trace:
    """The trace in a file of Azure's format (plain, or gzipped with a .gz suffix), named `name` or after
    the file. A `ValueError` names the file and the line of the first thing it cannot use, since a trace
    of thousands of rows is fixed by going to that line."""
    path = Path(path)
    opened = gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")
    with opened as file:
        lines = file.read().splitlines()
    comments = [line.lstrip("# ") for line in itertools.takewhile(lambda line: line.startswith("#"), lines)]
    header_number = len(comments) + 1  # lines count from 1
    if not lines:
        raise ValueError(f"{path}:1: empty file; expected the header {HEADER}")
    if header_number > len(lines):
        raise ValueError(f"{path}:{header_number}: the file ends before the header {HEADER}")
    header = lines[header_number - 1]
    if header.strip() != HEADER:
        raise ValueError(f"{path}:{header_number}: expected the header {HEADER}, got {header!r}")
    if header_number == len(lines):
        raise ValueError(f"{path}:{header_number + 1}: no requests after the header")
    times: list[datetime] = []
    prompt_lens: list[int] = []
    output_lens: list[int] = []
    for number, line in enumerate(lines[header_number:], start=header_number + 1):
        try:
            time, prompt_len, output_len = _parse_row(line)
            if times and time < times[-1]:
                raise ValueError(f"TIMESTAMP {time} is earlier than the previous request's, {times[-1]}")
        except ValueError as error:
            raise ValueError(f"{path}:{number}: {error}") from None
        times.append(time)
        prompt_lens.append(prompt_len)
        output_lens.append(output_len)
    return Trace(name=name or path.name.removesuffix(".gz").removesuffix(".csv"),
                 source=" ".join(comments) or str(path),
                 arrival_times=tuple((time - times[0]).total_seconds() for time in times),
                 prompt_lens=tuple(prompt_lens), output_lens=tuple(output_lens))


def _parse_row(line: str) -> tuple[datetime, int, int]:
    """One request's arrival time, prompt and output tokens; a `ValueError` that says what is wrong."""
    fields = line.split(",")
    if len(fields) != 3:
        raise ValueError(f"expected 3 fields, {HEADER}, got {len(fields)}: {line!r}")
    stamp, *counts = (field.strip() for field in fields)
    time = _parse_timestamp(stamp)
    for column, count in zip(HEADER.split(",")[1:], counts):
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"{column} must be an integer >= 1, got {count!r}")
    return time, int(counts[0]), int(counts[1])


def _parse_timestamp(stamp: str) -> datetime:
    """`2023-11-16 18:15:46.6805900` to the microsecond; a `ValueError` for anything else."""
    match = _TIMESTAMP.fullmatch(stamp)
    try:
        if match:  # fromisoformat still refuses what no calendar has (month 13, 25 o'clock)
            microsecond = int(((match[2] or "") + "000000")[:6])
            return datetime.fromisoformat(match[1]).replace(microsecond=microsecond)
    except ValueError:
        pass
    raise ValueError(f"TIMESTAMP must be a date and time like 2023-11-16 18:15:46.68, got {stamp!r}")


def load_trace(trace: str | Path) -> Trace:
    """A trace shipped in core/data by its name in `TRACE_FILES`, else the trace in the file at `trace`."""
    if isinstance(trace, str) and trace in TRACE_FILES:
        return _shipped_trace(trace)
    if not Path(trace).is_file():
        raise ValueError(f"unknown trace {str(trace)!r}: neither a file nor one of {', '.join(TRACE_FILES)}")
    return read_trace(trace)


@functools.cache
def _shipped_trace(name: str) -> Trace:
    """Read once per process: a sweep replays the same trace at every point."""
    return read_trace(Path(__file__).parent / "data" / TRACE_FILES[name], name=name)
