"""`DisaggregatedLLM`: `LLM.generate` served by a prefill engine and a decode engine, each in its own process.

The router (this object, in the caller's process) sends every request through both, as vLLM's
disaggregated-prefill proxy does:
1. to the prefill engine (`kv_role="kv_producer"`) as a copy with `max_tokens=1`: it runs the prompt, and
   its KV connector saves the prompt's K/V (all but the last token) in the step that computed it; the
   one sampled token is discarded. Its output carries the `kv_transfer_params`;
2. with those params to the decode engine (`kv_role="kv_consumer"`): it admits the request with the
   prompt's tokens but the last counted as computed, loads their K/V into its own blocks, recomputes the
   last token to sample the first output token (so greedy outputs equal one colocated engine's), and
   decodes to the end.
The simulator's `Cluster` (sim/cluster.py) models the same journey; `DisaggTimings` on each output says
where the time went (prefill, transfer with its bytes, decode), measured.

Failures stay with the requests they hit: a prompt an engine refuses (too long for the decode engine's
pool, say), K/V that fails to save or load, or a dead engine process fail only the requests involved, and
`generate` raises `DisaggregatedGenerateError` once every other request has finished, with their outputs
attached. Every wait is bounded (`timeout_s` without any message), and K/V saved for a request that will
never be loaded is discarded. Blocks return to both pools; `stats()` shows it.

Each engine is an `EngineCore` process (ref_engine/engine_core/, the same core the API server runs), driven
through a `SyncMPClient`; the router waits on both with `wait_for_outputs`.

Each role has its device (`prefill_device`, `decode_device`; both default to `device`, and that to the first
GPU if there is one, else the CPU). Two roles on one GPU share it as two vLLM instances do: each sizes its
KV pool from its own `gpu_memory_utilization` share of the whole device (in `prefill_config` and
`decode_config`), so the pair is refused when the two shares add up to more than 1 (`place_pair`).

Use it as a context manager (or call `close()`): it stops both processes. Engine processes are spawned,
so a script that builds one needs the usual `if __name__ == "__main__":` guard.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from core.config import EngineConfig
from ref_engine.disagg.timings import DisaggTimings
from ref_engine.engine import PromptType, as_batch
from ref_engine.engine_core.client import EngineDeadError, SyncMPClient, wait_for_outputs
from ref_engine.engine_core.core import EngineCoreArgs
from ref_engine.engine_core.messages import EngineCoreOutputs, EngineCoreRequest, EngineCoreStats
from ref_engine.kv_transfer.config import KVTransferConfig
from ref_engine.kv_transfer.connector import KVTransferParams
from ref_engine.outputs import RequestOutput
from ref_engine.sampling_params import SamplingParams


class DisaggregatedGenerateError(RuntimeError):
    """Some requests failed. `outputs` holds, in prompt order, the finished ones (None where one failed);
    `errors` maps each failed prompt's index to what went wrong."""

    def __init__(self, outputs: list[RequestOutput | None], errors: dict[int, str]) -> None:
        self.outputs = outputs
        self.errors = errors
        lines = "\n".join(f"  prompt {i}: {error}" for i, error in sorted(errors.items()))
        super().__init__(f"{len(errors)} of {len(outputs)} requests failed:\n{lines}")


@dataclass
class _InFlight:
    """One request's journey so far, as the router sees it."""

    index: int  # its prompt's position
    prompt: PromptType
    params: SamplingParams
    submitted_at: float
    prefilled: RequestOutput | None = None  # the prefill engine's output, once it came
    forwarded_at: float = 0.0  # when it went on to the decode engine
    done: bool = False


@dataclass
class _Run:
    """One `generate` call's bookkeeping."""

    requests: dict[str, _InFlight]
    outputs: list[RequestOutput | None]
    errors: dict[int, str] = field(default_factory=dict)

    def pending(self) -> list[str]:
        return [request_id for request_id, r in self.requests.items() if not r.done]

    def active(self, request_id: str) -> _InFlight | None:
        """The request if it is this run's and still pending (an earlier run's, given up on, is not)."""
        request = self.requests.get(request_id)
        return None if request is None or request.done else request

    def fail(self, request_id: str, error: str) -> None:
        request = self.requests[request_id]
        request.done = True
        self.errors[request.index] = error


class DisaggregatedLLM:
    """`DisaggregatedLLM(model, prefill_config, decode_config).generate(prompts, SamplingParams(...))`."""

    def __init__(self, model: str | Path | None = None, prefill_config: EngineConfig | None = None,
                 decode_config: EngineConfig | None = None, *, dtype: str = "float32", device: str | None = None,
                 prefill_device: str | None = None, decode_device: str | None = None,
                 kv_connector: str = "SharedMemoryConnector", kv_connector_module_path: str | None = None,
                 kv_connector_extra_config: dict[str, Any] | None = None, timeout_s: float = 120.0,
                 startup_timeout_s: float = 300.0) -> None:
        """`model`: a path, or None for the default SmolLM2; each process loads its own copy. The two
        configs may differ in anything but `block_size` (the K/V moves block by block). `device`: both
        roles' device, unless `prefill_device` or `decode_device` names the role's own (`place_pair`).
        `timeout_s`: the longest wait for any message from the engines while requests are pending, before
        they fail."""
        prefill_config = prefill_config or EngineConfig()
        decode_config = decode_config or EngineConfig()
        if prefill_config.block_size != decode_config.block_size:
            raise ValueError(f"prefill and decode engines must share block_size, got {prefill_config.block_size} "
                             f"and {decode_config.block_size}")
        if model is not None and not isinstance(model, (str, Path)):
            raise ValueError("model must be a path or None: each engine process loads its own copy")
        prefill_device, decode_device = place_pair(prefill_device or device, decode_device or device,
                                                   prefill_config, decode_config)
        self.timeout_s = timeout_s
        self._next_id = 0
        connector = dict(kv_connector=kv_connector, kv_connector_module_path=kv_connector_module_path,
                         kv_connector_extra_config=kv_connector_extra_config or {})

        def engine(role: str, config: EngineConfig, kv_role: str, device: str) -> SyncMPClient:
            # one torch thread each: the two engines share the machine's cores
            return SyncMPClient(EngineCoreArgs(model, dtype, device, num_threads=1, engine_kwargs={"config": config},
                                               kv_transfer_config=KVTransferConfig(kv_role=kv_role, **connector)),
                                role)

        self.prefill = engine("prefill", prefill_config, "kv_producer", prefill_device)
        self.decode = engine("decode", decode_config, "kv_consumer", decode_device)
        try:
            for core in (self.prefill, self.decode):  # both load their model meanwhile
                core.wait_ready(startup_timeout_s)
        except BaseException:
            self.close()
            raise

    # ---- lifetime ----

    def close(self) -> None:
        """Stop both engine processes (idempotent)."""
        for engine in (self.prefill, self.decode):
            engine.close()

    def __enter__(self) -> DisaggregatedLLM:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def stats(self) -> dict[str, EngineCoreStats]:
        """Each engine's pool and queues, by role ("prefill", "decode"); call it between `generate`s."""
        return {engine.name: engine.stats(self.timeout_s) for engine in (self.prefill, self.decode)}

    # ---- serving ----

    def generate(self, prompts: PromptType | list[PromptType],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Every prompt through prefill, KV transfer and decode; outputs in prompt order, each with its
        `disagg_timings`. Raises `DisaggregatedGenerateError` after the run if any request failed."""
        for engine in (self.prefill, self.decode):
            if engine.dead:
                raise EngineDeadError(f"{engine.death}; close this DisaggregatedLLM and start a new one")
        prompts, params = as_batch(prompts, sampling_params)
        run = _Run({}, [None] * len(prompts))
        for index, (prompt, p) in enumerate(zip(prompts, params)):
            request_id = str(self._next_id)
            self._next_id += 1
            run.requests[request_id] = _InFlight(index, prompt, p, time.perf_counter())
            try:
                self.prefill.add_request(EngineCoreRequest(request_id, prompt, replace(p, max_tokens=1, min_tokens=0)))
            except EngineDeadError as error:
                run.fail(request_id, str(error))
        while run.pending():
            self._route_next(run)
        if run.errors:
            raise DisaggregatedGenerateError(run.outputs, run.errors)
        return run.outputs  # type: ignore[return-value]  # no None is left when nothing failed

    def _route_next(self, run: _Run) -> None:
        """Wait for outputs from either engine (bounded) and act on each."""
        ready = wait_for_outputs([e for e in (self.prefill, self.decode) if not e.dead], self.timeout_s)
        if not ready:
            for request_id in run.pending():
                run.fail(request_id, f"no word from either engine for {self.timeout_s:g} s")
            return
        for engine in ready:
            while not engine.dead:
                try:
                    outputs = engine.get_output(0)
                except EngineDeadError as error:
                    self._engine_died(run, engine, str(error))
                    break
                if outputs is None:
                    break
                for request_id, error in outputs.errors.items():
                    if run.active(request_id) is not None:
                        run.fail(request_id, f"the {engine.name} engine could not serve it: {error.message}")
                for output in outputs.outputs:
                    if engine is self.prefill:
                        self._from_prefill(run, output)
                    else:
                        self._from_decode(run, output, outputs)

    def _from_prefill(self, run: _Run, output: RequestOutput) -> None:
        request = run.active(output.request_id)
        kv = output.kv_transfer_params
        if kv is None or kv.error is not None:
            error = f"KV transfer failed on the prefill side: {kv.error if kv else 'no K/V was saved'}"
            kv = None  # nothing to discard
        elif output.error is not None:
            error = f"the prefill engine could not serve it: {output.error}"
        else:
            error = self.decode.death  # None while the decode engine lives
        if request is None or error is not None:  # an earlier run's request, or a failed one: nobody loads its K/V
            if kv is not None:
                self._discard(kv)
            if request is not None:
                run.fail(output.request_id, error)
            return
        request.prefilled = output
        request.forwarded_at = time.perf_counter()
        try:
            self.decode.add_request(EngineCoreRequest(output.request_id, _decode_prompt(request.prompt, output),
                                                      request.params, kv_transfer_params=kv))
        except EngineDeadError as error:
            self._engine_died(run, self.decode, str(error))

    def _from_decode(self, run: _Run, output: RequestOutput, outputs: EngineCoreOutputs) -> None:
        request = run.active(output.request_id)
        if request is None:
            return
        if output.error is not None:
            run.fail(output.request_id, f"the decode engine could not serve it: {output.error}")
            return
        request.done = True
        prefilled = request.prefilled
        kv: KVTransferParams = prefilled.kv_transfer_params
        times = [t + outputs.clock_origin for t in output.metrics.token_times]  # the engine's clock -> perf_counter
        transfer_s = request.forwarded_at - kv.saved_at + output.metrics.kv_load_s
        timings = DisaggTimings(
            prefill_s=kv.saved_at - request.submitted_at, transfer_s=transfer_s, transfer_bytes=kv.num_bytes,
            decode_s=times[-1] - kv.saved_at - transfer_s, ttft_s=times[0] - request.submitted_at,
            itl_s=tuple(b - a for a, b in zip(times, times[1:])))
        run.outputs[request.index] = replace(
            output, prompt=prefilled.prompt, num_cached_tokens=prefilled.num_cached_tokens,
            prefix_cache=prefilled.prefix_cache, disagg_timings=timings)

    def _engine_died(self, run: _Run, engine: SyncMPClient, error: str) -> None:
        """Fail the requests the dead engine held. Requests past a dead prefill engine go on; those still
        to reach a dead decode engine fail as their prefill comes back (and their K/V is discarded)."""
        for request_id in run.pending():
            request = run.requests[request_id]
            at_decode = request.prefilled is not None
            if at_decode == (engine is self.decode):
                if at_decode:
                    self._discard(request.prefilled.kv_transfer_params)
                run.fail(request_id, error)

    def _discard(self, kv: KVTransferParams) -> None:
        """Have the producer free K/V nobody will load (if it is gone, the resource tracker will)."""
        if not self.prefill.dead:
            try:
                self.prefill.call_utility_nowait("discard_kv", kv)
            except EngineDeadError:
                pass


def place_pair(prefill_device: str | None, decode_device: str | None, prefill_config: EngineConfig,
               decode_config: EngineConfig) -> tuple[str, str]:
    """The device each role's engine gets, spelt out: the one given, else the first GPU if this machine has
    one (a bare "cuda" is "cuda:0", as in a fresh process), else "cpu". ValueError for two roles on one GPU
    whose `gpu_memory_utilization` shares add up to more than the whole device."""
    default = "cuda:0" if torch.cuda.is_available() else "cpu"
    placed = []
    for given in (prefill_device, decode_device):
        device = torch.device(given or default)
        placed.append(torch.device("cuda", 0) if device.type == "cuda" and device.index is None else device)
    prefill, decode = placed
    shares = prefill_config.gpu_memory_utilization, decode_config.gpu_memory_utilization
    if prefill == decode and prefill.type == "cuda" and sum(shares) > 1:
        raise ValueError(
            f"the prefill and decode engines share {prefill}, and each may take its gpu_memory_utilization "
            f"share of all of it: {shares[0]} + {shares[1]} > 1; lower prefill_config's and decode_config's "
            "gpu_memory_utilization (e.g. 0.45 each), or give each role its own device (prefill_device, "
            "decode_device)")
    return str(prefill), str(decode)


def _decode_prompt(prompt: PromptType, prefilled: RequestOutput) -> PromptType:
    """The prompt as the decode engine gets it: the prefill's token ids, with the tenant and cache salt."""
    if not isinstance(prompt, dict):
        return prefilled.prompt_token_ids
    keys = {key: prompt[key] for key in ("tenant", "cache_salt") if key in prompt}
    return {"prompt_token_ids": prefilled.prompt_token_ids, **keys}
