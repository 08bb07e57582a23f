"""A soak with faults: `serving-lab serve` under mixed traffic for a bounded time, then an audit.

    python benchmarks/soak.py [--duration 600] [--clients 12] [--port 8031] [--no-crash]

The server runs as a subprocess on 127.0.0.1 (the default model, SmolLM2-135M-Instruct, unless `--model`),
with three API keys (tenants `acme` weight 3, `globex` weight 1 with a pending cap of 4, `initech` with a
token budget) and an operator key, under the "fair" policy. Clients send, until the time is up:
streaming and plain requests, long and short prompts, prompts that share a tenant's system prompt,
streams the client leaves mid-way, requests the client cancels, malformed JSON, bodies over the size cap,
prompts beyond `max_model_len`, bursts past a tenant's pending cap, `reset_prefix_cache` under load, and
cross-tenant probes (a tenant sends a prompt another tenant has just run: its cached tokens must be 0).
Once, a quarter of the way in, the engine-core process is killed (`kill -9`): the server must fail the
open requests and exit non-zero, as vLLM's does, so that a supervisor restarts it; this script is that
supervisor.

The audit at the end: no request running or waiting and no KV block in use (the server's /metrics), the
resident memory of both processes within 10% of its value after warm-up (the instance alive at the end,
sampled every few seconds), every request accounted for (completed, aborted by its client, or refused
with the status its kind expects; during the crash, failed with a 503 or a closed connection), and no
cross-tenant prefix hit. It prints a Markdown block for benchmarks/RESULTS.md. `tests/serving_lab/
test_soak.py` runs a short version (about a minute) in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

KEYS = {  # API key -> the tenant and its limits (the server's --api-key-file)
    "key-acme": {"tenant": "acme", "weight": 3.0},
    "key-globex": {"tenant": "globex", "weight": 1.0, "max_pending_requests": 4},
    "key-initech": {"tenant": "initech", "weight": 1.0, "token_budget": 6000, "budget_window_s": 10.0},
    "key-operator": {"tenant": "operator", "admin": True},
}
TENANT_KEYS = ("key-acme", "key-globex", "key-initech")
MAX_MODEL_LEN = 1024
MAX_REQUEST_BYTES = 64 * 1024
RSS_GOAL = 0.10

# A request kind: how often a client picks it, and the statuses it may end with besides success.
KINDS = {
    "stream": 10, "plain": 6, "long": 2, "shared_prefix": 6, "disconnect": 2, "cancel": 2, "malformed": 1,
    "oversized": 1, "too_long": 1, "burst": 1, "reset": 1, "probe": 2,
}
EXPECTED_REFUSALS = {
    "malformed": {400}, "oversized": {413}, "too_long": {400}, "burst": {429},
}
BUDGET_REFUSAL = 429  # any tenant request may meet its tenant's cap or budget: a 429 is accounted, not an error

WORDS = ("block table prefill decode token budget scheduler cache tenant queue batch stream latency kernel "
         "attention memory page eviction hit miss preempt swap chunk speculative draft verify").split()


@dataclass
class Ledger:
    """What became of every request a client sent."""

    outcomes: Counter[str] = field(default_factory=Counter)  # "kind:completed", "kind:refused:429", ...
    unexpected: list[str] = field(default_factory=list)  # anything the kind did not allow, with why
    cross_tenant_hits: int = 0
    probes: int = 0
    sent: int = 0
    output_tokens: int = 0

    def add(self, kind: str, outcome: str) -> None:
        self.outcomes[f"{kind}:{outcome}"] += 1


@dataclass
class Server:
    """The `serving-lab serve` subprocess, restarted when it exits (the supervisor's job)."""

    argv: list[str]
    port: int
    log: Path
    process: subprocess.Popen | None = None
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)
    started_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = time.monotonic()

    async def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.process.returncode} while starting; "
                                       f"see {self.log}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        return
                await asyncio.sleep(0.5)
        raise TimeoutError(f"the server did not become ready in {timeout:.0f} s; see {self.log}")

    def engine_core_pid(self) -> int | None:
        """The engine-core child of the server process: the one multiprocessing spawned (Linux: /proc's
        children list; the other child, if any, is multiprocessing's resource tracker)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        for pid in children.read_text().split() if children.exists() else ():
            with contextlib.suppress(OSError):
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return int(pid)
        return None

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()


def rss_bytes(pid: int | None) -> int | None:
    """A process's resident set (VmRSS), or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, TypeError):
        return None
    return None


def text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


@dataclass
class Soak:
    """The clients, the fault injector and the supervisor around one `Server`."""

    server: Server
    duration_s: float
    clients: int
    crash_at_s: float | None
    warmup_s: float
    seed: int
    ledger: Ledger = field(default_factory=Ledger)
    crash_window: tuple[float, float] | None = None  # from the kill until the server answers again
    # (server instance, seconds since it started, API server RSS, engine-core RSS)
    rss: list[tuple[int, float, int | None, int | None]] = field(default_factory=list)
    system_prompts: dict[str, str] = field(default_factory=dict)
    probe_prompts: dict[str, str] = field(default_factory=dict)  # tenant key -> a prompt it has run

    async def run(self) -> None:
        self.end = time.monotonic() + self.duration_s
        rng = random.Random(self.seed)
        self.system_prompts = {key: f"You are {key}'s assistant. " + text(rng, 120) for key in TENANT_KEYS}
        limits = httpx.Limits(max_connections=4 * self.clients + 32)
        async with httpx.AsyncClient(base_url=self.server.url, timeout=120.0, limits=limits) as client:
            tasks = [asyncio.create_task(self._client(client, i, random.Random(self.seed * 1000 + i)))
                     for i in range(self.clients)]
            tasks += [asyncio.create_task(self._supervise()), asyncio.create_task(self._sample_rss())]
            await asyncio.gather(*tasks)

    def _during_crash(self, started: float) -> bool:
        """Whether a request sent at `started` and ending now overlapped the engine core's death: from the
        kill until the restarted server answered (plus a second for answers already on their way)."""
        if self.crash_window is None:
            return False
        killed, back = self.crash_window
        return started <= back + 1.0 and time.monotonic() >= killed

    async def _client(self, client: httpx.AsyncClient, index: int, rng: random.Random) -> None:
        """Send requests until the time is up: every kind once first (spread over the clients, so even a
        short soak tries each fault), then kinds drawn by their weights."""
        kinds, weights = zip(*KINDS.items())
        for turn in itertools.count():
            if time.monotonic() >= self.end:
                break
            slot = index + turn * self.clients
            first_round = slot < len(kinds)  # as acme, which has no cap or budget to get in the way
            kind = kinds[slot] if first_round else rng.choices(kinds, weights)[0]
            key = "key-acme" if first_round else rng.choice(TENANT_KEYS)
            started = time.monotonic()
            try:
                outcome = await getattr(self, f"_{kind}")(client, rng, key)
            except (httpx.TransportError, RuntimeError) as error:  # RuntimeError: a stream cut mid-way
                outcome = "crash" if self._during_crash(started) else f"unexpected:{type(error).__name__}: {error}"
            if isinstance(outcome, int):
                outcome = self._judge_status(kind, outcome, started)
            if outcome.startswith("unexpected:"):
                self.ledger.unexpected.append(f"{kind}: {outcome.removeprefix('unexpected:')}")
                outcome = "unexpected"
            self.ledger.add(kind, outcome)
            if outcome == "crash":  # the server is restarting: do not spin on refused connections
                await asyncio.sleep(0.5)

    def _judge_status(self, kind: str, status: int, started: float) -> str:
        if status == 200:
            return "completed"
        if status in EXPECTED_REFUSALS.get(kind, ()) or status == BUDGET_REFUSAL:
            return f"refused:{status}"
        if status in (500, 503) and self._during_crash(started):
            return "crash"
        return f"unexpected:HTTP {status}"

    # ---- the kinds: each returns an HTTP status or an outcome string ----

    def _headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    async def _completion(self, client: httpx.AsyncClient, key: str, prompt: str, max_tokens: int) -> int:
        self.ledger.sent += 1
        response = await client.post("/v1/completions", headers=self._headers(key),
                                     json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        if response.status_code == 200:
            self.ledger.output_tokens += response.json()["usage"]["completion_tokens"]
        return response.status_code

    async def _stream(self, client: httpx.AsyncClient, rng: random.Random, key: str,
                      leave_after: int | None = None) -> int | str:
        self.ledger.sent += 1
        body = {"messages": [{"role": "user", "content": text(rng, rng.randint(5, 60))}],
                "max_tokens": rng.randint(8, 48), "stream": True, "temperature": 0.7, "seed": rng.randint(0, 99)}
        async with client.stream("POST", "/v1/chat/completions", headers=self._headers(key), json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return response.status_code
            chunks = 0
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return 200
                event = json.loads(line.removeprefix("data: "))
                if "error" in event:
                    return int(event["error"].get("code") or 500)
                chunks += 1
                if leave_after is not None and chunks >= leave_after:
                    return "aborted"  # leaving the block closes the connection mid-stream
                self.ledger.output_tokens += 1
        raise RuntimeError("the stream ended without [DONE]")

    async def _plain(self, client, rng, key):
        return await self._completion(client, key, text(rng, rng.randint(5, 80)), rng.randint(4, 32))

    async def _long(self, client, rng, key):
        return await self._completion(client, key, text(rng, 500), 8)

    async def _shared_prefix(self, client, rng, key):
        return await self._completion(client, key, self.system_prompts[key] + text(rng, 10), 12)

    async def _disconnect(self, client, rng, key):
        return await self._stream(client, rng, key, leave_after=2)

    async def _cancel(self, client, rng, key):
        self.ledger.sent += 1
        request = client.post("/v1/completions", headers=self._headers(key),
                              json={"prompt": text(rng, 40), "max_tokens": 200, "ignore_eos": True})
        try:
            response = await asyncio.wait_for(request, timeout=rng.uniform(0.2, 1.0))
        except asyncio.TimeoutError:
            return "aborted"
        return response.status_code

    async def _malformed(self, client, rng, key):
        self.ledger.sent += 1
        response = await client.post("/v1/completions", headers={**self._headers(key), "content-type":
                                     "application/json"}, content=b'{"prompt": "unterminated')
        return response.status_code

    async def _oversized(self, client, rng, key):
        self.ledger.sent += 1
        response = await client.post("/v1/completions", headers=self._headers(key),
                                     json={"prompt": "x" * (MAX_REQUEST_BYTES + 10), "max_tokens": 1})
        return response.status_code

    async def _too_long(self, client, rng, key):
        return await self._completion(client, key, text(rng, MAX_MODEL_LEN + 200), 4)

    async def _burst(self, client, rng, key):
        """Twice globex's pending cap at once: the ones past it get 429, the rest complete."""
        started = time.monotonic()
        statuses = await asyncio.gather(*(self._completion(client, "key-globex", text(rng, 20), 24)
                                          for _ in range(8)), return_exceptions=True)
        outcomes = []
        for status in statuses:
            if isinstance(status, BaseException):
                outcomes.append("crash" if self._during_crash(started) else f"unexpected:{type(status).__name__}")
            else:
                outcomes.append(self._judge_status("burst", status, started))
        for outcome in outcomes[1:]:  # the first is returned and counted by the caller
            if outcome.startswith("unexpected:"):
                self.ledger.unexpected.append(f"burst: {outcome}")
                outcome = "unexpected"
            self.ledger.add("burst", outcome)
        return outcomes[0]

    async def _reset(self, client, rng, key):
        self.ledger.sent += 1
        response = await client.post("/reset_prefix_cache", headers=self._headers("key-operator"))
        return response.status_code

    async def _probe(self, client, rng, key):
        """Run a prompt as this tenant, then the same prompt as another: the other must hit nothing of it."""
        started = time.monotonic()
        own = f"probe {rng.random():.12f} " + text(rng, 80)
        status = await self._completion(client, key, own, 1)
        if status != 200:
            return status
        other = rng.choice([k for k in TENANT_KEYS if k != key])
        self.ledger.sent += 1
        response = await client.post("/v1/completions", headers=self._headers(other),
                                     json={"prompt": own, "max_tokens": 1})
        if response.status_code == 200:
            self.ledger.probes += 1
            details = response.json()["usage"].get("prompt_tokens_details") or {}
            if details.get("cached_tokens"):
                self.ledger.cross_tenant_hits += 1
        self.ledger.add("probe", self._judge_status("probe", response.status_code, started))
        return status

    # ---- the fault and the supervisor ----

    async def _supervise(self) -> None:
        """Kill the engine core once; then restart the server when it exits (or see it recover)."""
        if self.crash_at_s is None:
            return
        await asyncio.sleep(self.crash_at_s)
        pid = self.server.engine_core_pid()
        if pid is None:
            raise RuntimeError("no engine-core process to kill")
        killed = time.monotonic()
        self.crash_window = (killed, float("inf"))
        os.kill(pid, signal.SIGKILL)
        deadline = killed + 60.0
        while self.server.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if self.server.process.poll() is None:
            raise RuntimeError("the server outlived its engine core by 60 s (a zombie server)")
        self.server.exit_codes.append(self.server.process.returncode)
        self.server.restarts += 1
        self.server.start()
        await self.server.wait_ready()
        self.crash_window = (killed, time.monotonic())

    async def _sample_rss(self) -> None:
        while time.monotonic() < self.end:
            process = self.server.process
            self.rss.append((self.server.restarts, time.monotonic() - self.server.started_at,
                             rss_bytes(process.pid),
                             rss_bytes(self.server.engine_core_pid() if process.poll() is None else None)))
            await asyncio.sleep(2.0)


def server_gauges(url: str) -> dict[str, float]:
    """The server's /metrics as {series name: value}, summed over labels."""
    values: Counter[str] = Counter()
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            values[sample.name] += sample.value
    return dict(values)


@dataclass
class SoakReport:
    duration_s: float
    ledger: Ledger
    gauges: dict[str, float]
    rss_after_warmup: tuple[int, int] | None
    rss_at_end: tuple[int, int] | None
    restarts: int
    exit_codes: list[int]
    final_exit_code: int | None
    recovery_s: float | None  # from the engine core's kill until the restarted server answered

    @property
    def rss_growth(self) -> tuple[float, float] | None:
        if not self.rss_after_warmup or not self.rss_at_end:
            return None
        return tuple(end / start - 1 for start, end in zip(self.rss_after_warmup, self.rss_at_end))

    def problems(self, check_rss: bool = True) -> list[str]:
        """What the audit found wrong; [] is a clean soak."""
        found = [f"unexpected outcome: {u}" for u in self.ledger.unexpected[:20]]
        for series in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            if self.gauges.get(series, 0) != 0:
                found.append(f"{series} = {self.gauges[series]} at the end (expected 0)")
        if self.ledger.cross_tenant_hits:
            found.append(f"{self.ledger.cross_tenant_hits} cross-tenant prefix hit(s)")
        if any(code == 0 for code in self.exit_codes):
            found.append("the server exited 0 after its engine core died (expected non-zero)")
        if self.final_exit_code not in (0, None):
            found.append(f"the server's graceful stop exited {self.final_exit_code}")
        growth = self.rss_growth
        if check_rss and growth is None:
            found.append("no RSS baseline: the run was too short")
        elif check_rss and max(growth) > RSS_GOAL:
            found.append(f"RSS grew {growth[0]:+.1%} (API server) / {growth[1]:+.1%} (engine core) after warm-up")
        return found


async def run_soak(duration_s: float, *, clients: int = 12, port: int = 8031, model: str | None = None,
                   crash: bool = True, warmup_s: float | None = None, seed: int = 0,
                   log_dir: Path | None = None) -> SoakReport:
    """Start the server, soak it, audit it, stop it."""
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    keys = log_dir / "keys.json"
    keys.write_text(json.dumps(KEYS))
    argv = [sys.executable, "-m", "serving_lab.cli", "serve", *([model] if model else []), "--port", str(port),
            "--api-key-file", str(keys), "--scheduling-policy", "fair", "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-seqs", "16", "--max-pending-requests", "48", "--max-request-bytes", str(MAX_REQUEST_BYTES),
            "--graceful-timeout", "5"]
    server = Server(argv, port, log_dir / "server.log")
    server.start()
    try:
        await server.wait_ready()
        warmup_s = duration_s * 0.2 if warmup_s is None else warmup_s
        soak = Soak(server, duration_s, clients, duration_s * 0.25 if crash else None, warmup_s, seed)
        await soak.run()
        await asyncio.sleep(1.0)  # the last aborts reach the core
        gauges = server_gauges(server.url)
        # memory of the instance alive at the end, from its own warm-up on (a restarted one starts afresh)
        settled = [(api, core) for instance, t, api, core in soak.rss
                   if instance == server.restarts and api and core and t >= warmup_s]
        baseline, end = (settled[0], settled[-1]) if len(settled) > 1 else (None, None)
    finally:
        final_exit = server.stop()
    recovery_s = soak.crash_window[1] - soak.crash_window[0] if soak.crash_window else None
    return SoakReport(duration_s, soak.ledger, gauges, baseline, end, server.restarts, server.exit_codes,
                      final_exit, recovery_s)


def markdown(report: SoakReport, command: str) -> str:
    ledger = report.ledger
    by_kind: dict[str, Counter[str]] = {}
    for name, count in ledger.outcomes.items():
        kind, _, outcome = name.partition(":")
        by_kind.setdefault(kind, Counter())[outcome] += count
    total = sum(ledger.outcomes.values())
    rows = "\n".join(f"| {kind} | {sum(c.values())} | " + ", ".join(f"{o} {n}" for o, n in sorted(c.items())) + " |"
                     for kind, c in sorted(by_kind.items()))
    growth = report.rss_growth
    problems = report.problems()
    return f"""### Soak with faults ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)

Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. Command: `{command}`.

Load held: {total} requests in {report.duration_s:.0f} s ({total / report.duration_s:.1f} requests/s), \
{ledger.output_tokens} output tokens ({ledger.output_tokens / report.duration_s:.1f} tok/s).
Faults: engine core killed {report.restarts} time(s); the server exited with {report.exit_codes} and was
restarted, answering again {report.recovery_s or 0:.1f} s after the kill. Cross-tenant probes: {ledger.probes}, hits {ledger.cross_tenant_hits}.
At the end: running {report.gauges.get('vllm:num_requests_running')}, waiting \
{report.gauges.get('vllm:num_requests_waiting')}, KV usage {report.gauges.get('vllm:kv_cache_usage_perc')}.
RSS after warm-up / at the end (API server, engine core): {report.rss_after_warmup} / {report.rss_at_end}
(growth {'n/a' if growth is None else f'{growth[0]:+.1%} / {growth[1]:+.1%}'}; goal within {RSS_GOAL:.0%}).

| kind | requests | outcomes |
| --- | --- | --- |
{rows}

Audit: {'clean' if not problems else '; '.join(problems)}.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic (default 600)")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--port", type=int, default=8031)
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--no-crash", action="store_true", help="do not kill the engine core")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    report = asyncio.run(run_soak(args.duration, clients=args.clients, port=args.port, model=args.model,
                                  crash=not args.no_crash, seed=args.seed))
    print(markdown(report, "python benchmarks/soak.py " + " ".join(sys.argv[1:])))
    sys.exit(1 if report.problems() else 0)


if __name__ == "__main__":
    main()
