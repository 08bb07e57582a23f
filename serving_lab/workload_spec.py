"""Workloads named on the command line: `synthetic:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE][,tenants=MIX]`,
`chat:...`, `copy:...`, `trace:...` and `replay:...` (below).

One short string, so `serving-lab simulate`, `sweep` and `report` need no file for the common case:
NUM_REQUESTS requests of PROMPT_LEN prompt tokens that each generate OUTPUT_LEN tokens, all arriving at time
0, or as a Poisson stream of RATE requests per second (`Workload.synthetic`, seed 0). A length may be a range
LO-HI, drawn uniformly per request. `synthetic:64:128:64:8` is 64 requests of 128 + 64 tokens at 8
requests/s; `synthetic:2000:32-1024:16-512:20` a mixed stream.

`,tenants=NAME:SHARE,...` shares the requests out among tenants in those proportions, interleaved
(`Workload.with_tenant_mix`): `synthetic:64:128:64:8,tenants=a:3,b:1` sends 48 requests as tenant a and 16 as
b. A tenant's weight is not its share of the traffic: weights come from the manifest's `tenants:` section.

`chat:NUM_CONVERSATIONS:TURNS:SYSTEM_LEN:USER_LEN:OUTPUT_LEN[:RATE]` replays a chat service's shape
(`Workload.chat`): every conversation opens with one shared SYSTEM_LEN-token system prompt (0: none), and
turn k re-sends the whole history (the earlier USER_LEN-token messages and OUTPUT_LEN-token replies) before
its new message, so prefix caching has the system prompt and the earlier turns to hit. The tokens are random
ids, so prompt-lookup speculation finds only what the model itself repeats (lesson 7's sweep: no drafts).
Requests go turn by turn, all at time 0 or RATE requests/s:
`chat:8:3:64:32:16` is 24 requests whose prompts grow from 96 to 192 tokens; tenants work as above.

`copy:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE]` sends prompts whose continuation repeats them
(`Workload.copying`): each a 64-token random passage written out again up to PROMPT_LEN tokens (at least 128),
which the model goes on copying. Work that quotes its input, at its extreme: the one shape here where
prompt-lookup speculation drafts and the engine accepts (`copy:12:256:48` in lesson 7's sweep).

`trace:NAME:NUM_REQUESTS[:RATE]` draws each request's prompt and output lengths, as a pair, from a published
production trace (`Workload.from_trace`; NAME `azure-conv-2023`, a chat service, or `azure-code-2023`, code
completion, from Azure's 2023 LLM inference traces): `trace:azure-conv-2023:500:10` is 500 requests at 10
requests/s with the chat service's lengths (median prompt ~1,020 tokens, reply ~130, the longest prompts past
10k: give the simulator a max_model_len that holds them, or it refuses them).

`replay:TRACE[:TIME_SCALE[:NUM_REQUESTS]]` plays a production trace as it was sent (`Workload.replay`): every
request at its arrival time in the trace, divided by TIME_SCALE (default 1; 10 plays it ten times faster), with
its prompt and output lengths. TRACE is `azure-conv-2023` or `azure-code-2023`, the full hour of each service
(19,366 and 8,819 requests, `core.trace.TRACE_FILES`), or the path of a file in Azure's format,
`TIMESTAMP,ContextTokens,GeneratedTokens` (plain or .gz, a path without `:` or `,`). NUM_REQUESTS (default: the
whole trace) takes the trace's first requests, or, past its end, plays it again from the start:
`replay:azure-code-2023:10:1000` is the code service's first 1,000 requests, ten times faster (52 s).
"""

from __future__ import annotations

import math

from core.trace import load_trace
from core.workload import COPY_PASSAGE_LEN, TRACES, Workload

SYNTHETIC_SPEC = "synthetic:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE]"
CHAT_SPEC = "chat:NUM_CONVERSATIONS:TURNS:SYSTEM_LEN:USER_LEN:OUTPUT_LEN[:RATE]"
TRACE_SPEC = "trace:NAME:NUM_REQUESTS[:RATE]"
COPY_SPEC = "copy:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE]"
REPLAY_SPEC = "replay:TRACE[:TIME_SCALE[:NUM_REQUESTS]]"
WORKLOAD_SPEC = (f"{SYNTHETIC_SPEC}, {CHAT_SPEC}, {TRACE_SPEC}, {COPY_SPEC} or {REPLAY_SPEC}, "
                 "each with [,tenants=NAME:SHARE,...]")


def parse_workload(spec: str, seed: int = 0) -> Workload:
    """The `Workload` a spec names; a `ValueError` that shows the expected form for anything else."""
    lengths, _, option = spec.partition(",")
    kind, *fields = lengths.split(":")
    if kind == "synthetic" and len(fields) in (3, 4):
        counts: list[int | tuple[int, int]] = [
            _count(spec, "NUM_REQUESTS", fields[0]), _count(spec, "PROMPT_LEN", fields[1], ranged=True),
            _count(spec, "OUTPUT_LEN", fields[2], ranged=True)]
        workload = Workload.synthetic(*counts, arrival=_arrival(spec, fields[3:]), seed=seed, name=spec)
    elif kind == "chat" and len(fields) in (5, 6):
        names = ("NUM_CONVERSATIONS", "TURNS", "SYSTEM_LEN", "USER_LEN", "OUTPUT_LEN")
        sizes = [_count(spec, name, text, minimum=0 if name == "SYSTEM_LEN" else 1)
                 for name, text in zip(names, fields)]
        workload = Workload.chat(*sizes, arrival=_arrival(spec, fields[5:]), seed=seed, name=spec)
    elif kind == "copy" and len(fields) in (3, 4):
        num, prompt_len, output_len = (_count(spec, name, text) for name, text in
                                       zip(("NUM_REQUESTS", "PROMPT_LEN", "OUTPUT_LEN"), fields))
        if prompt_len < 2 * COPY_PASSAGE_LEN:
            raise ValueError(f"workload {spec!r}: PROMPT_LEN must be at least {2 * COPY_PASSAGE_LEN} (two "
                             f"{COPY_PASSAGE_LEN}-token passages, so the model sees one repeated), got {prompt_len}")
        workload = Workload.copying(num, prompt_len, output_len, arrival=_arrival(spec, fields[3:]), seed=seed,
                                    name=spec)
    elif kind == "trace" and len(fields) in (2, 3):
        if fields[0] not in TRACES:
            raise ValueError(f"workload {spec!r}: unknown trace {fields[0]!r}; known: {', '.join(TRACES)}")
        workload = Workload.from_trace(fields[0], _count(spec, "NUM_REQUESTS", fields[1]),
                                       arrival=_arrival(spec, fields[2:]), seed=seed, name=spec)
    elif kind == "replay" and len(fields) in (1, 2, 3):
        try:
            trace = load_trace(fields[0])
        except (OSError, ValueError) as error:  # OSError: a file that is not gzip, or not readable
            raise ValueError(f"workload {spec!r}: TRACE: {error}") from None
        time_scale = (_positive(spec, "TIME_SCALE", fields[1], "a positive number (10: ten times faster)")
                      if len(fields) > 1 else 1.0)
        num_requests = _count(spec, "NUM_REQUESTS", fields[2]) if len(fields) > 2 else None
        workload = Workload.replay(trace, time_scale, num_requests, seed=seed, name=spec)
    else:
        form = {"synthetic": SYNTHETIC_SPEC, "chat": CHAT_SPEC, "trace": TRACE_SPEC, "copy": COPY_SPEC,
                "replay": REPLAY_SPEC}.get(kind)
        got = f" (got {len(fields)} fields after {kind}:)" if form else f" (unknown kind {kind!r})"
        raise ValueError(f"workload {spec!r}: expected {form or WORKLOAD_SPEC}{got}, e.g. synthetic:64:128:64:8, "
                         "chat:8:3:64:32:16, trace:azure-conv-2023:500:10, copy:12:256:48 or "
                         "replay:azure-code-2023:10:1000")
    return workload.with_tenant_mix(_tenant_mix(spec, option)) if option else workload


def _count(spec: str, name: str, text: str, *, ranged: bool = False, minimum: int = 1) -> int | tuple[int, int]:
    """A field of the spec: an integer >= `minimum`, or with `ranged` a range LO-HI drawn per request."""
    parts = text.split("-") if ranged else [text]
    if len(parts) > 2 or not all(p.isdigit() and int(p) >= minimum for p in parts) or int(parts[0]) > int(parts[-1]):
        allowed = "a positive integer" if minimum else "a non-negative integer"
        raise ValueError(f"workload {spec!r}: {name} must be {allowed}{' or a range LO-HI' if ranged else ''}, "
                         f"got {text!r}")
    return int(parts[0]) if len(parts) == 1 else (int(parts[0]), int(parts[1]))


def _arrival(spec: str, rate: list[str]) -> str | float:
    """"all" without a RATE field, else the rate in requests/s."""
    return _positive(spec, "RATE", rate[0], "a positive number of requests/s") if rate else "all"


def _positive(spec: str, name: str, text: str, what: str) -> float:
    """A field of the spec that is a positive, finite number (`what` says so in the error)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"workload {spec!r}: {name} must be {what}, got {text!r}")
    return value


def _tenant_mix(spec: str, option: str) -> dict[str, int]:
    """`tenants=a:3,b:1` -> {"a": 3, "b": 1}."""
    if not option.startswith("tenants="):
        raise ValueError(f"workload {spec!r}: after the lengths comes only tenants=NAME:SHARE,... "
                         f"(e.g. tenants=a:3,b:1), got {option!r}")
    return parse_tenant_mix(option.removeprefix("tenants="), f"workload {spec!r}")


def parse_tenant_mix(mix: str, where: str) -> dict[str, int]:
    """`a:3,b:1` -> {"a": 3, "b": 1}; `where` names the flag or spec in the error."""
    shares: dict[str, int] = {}
    for item in mix.split(","):
        name, _, share = item.partition(":")
        if not name or not share.isdigit() or int(share) < 1 or name in shares:
            raise ValueError(f"{where}: each tenant is NAME:SHARE, a distinct name and a positive "
                             f"integer share (e.g. tenants=a:3,b:1), got {item!r}")
        shares[name] = int(share)
    return shares


def check_prompt_lengths(workload: Workload, max_model_len: int) -> None:
    """A `ValueError` when the workload has prompts that `max_model_len` leaves no room to answer (the
    scheduler would fail every one of them): better said before the run than as a table of nan."""
    too_long = [request.prompt_len for request in workload.requests if request.prompt_len >= max_model_len]
    if too_long:
        raise ValueError(f"workload {workload.name!r}: {len(too_long)} of {len(workload)} prompts have up to "
                         f"{max(too_long)} tokens, and max_model_len ({max_model_len}) leaves room for prompts "
                         f"of at most {max_model_len - 1}; shorten PROMPT_LEN or raise --max-model-len")
