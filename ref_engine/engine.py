"""`LLMEngine` and `LLM`: the serving loop around the shared core, on a real model.

One `LLMEngine.step()` is the loop every lesson draws: **schedule -> run the model -> sample -> update**.
The scheduler and KV cache manager are the torch-free objects of `core` (the simulator runs the
same ones); this module adds what needs the model: tokenizing prompts, the runner, the sampler, stop
strings, and the wall clock. Every step is timed and logged as a `StepRecord`, which is what calibrates the
simulator.

`step()` returns a `RequestOutput` for every request that finished in the step and, for each request
streamed with `output_kind=RequestOutputKind.DELTA`, one per step with its new tokens and text
(`finished=False` until the end; `IncrementalDetokenizer` keeps the text safe to send).

A request whose sampling raises fails alone: the batch is sampled again one request at a time to find
who raised, that request ends with `finish_reason="error"` and the error on its output, and the others
keep their tokens; so does a request whose own work after sampling (stop strings, its streamed delta)
raises. A server must not lose every request in a batch to one bad one. What could fail a request later
is checked when it is added instead: text fields that are not valid Unicode (lone surrogates) are refused
there, naming the field, so the prefix-cache key computed from them can never raise inside a step.

The prefix cache's namespace (`cache_namespace`) names everything the K/V depends on besides the tokens:
the model's name and weights digest, the dtype, the quantization, the KV-cache dtype and the tokenizer.
Two engines share block hashes only if all of these agree (two processes of a disaggregated pair on the
same file do; an engine restarted on other weights under the same name does not), and a consumer refuses
K/V a producer computed under another namespace.

`LLM` is the offline API in vLLM's shape: `LLM(model=None, dtype=..., **engine_knobs).generate(prompts,
SamplingParams(...))`. Every `EngineConfig` knob is a keyword (`max_num_seqs=8`, `scheduling="static"`, ...).

With speculative decoding on (`speculative_method="ngram"` or `"draft_model"`), the loop gains a fifth
move, **propose**: after the update, the proposer drafts tokens for the requests the scheduler allows
(`Scheduler.requests_to_speculate`), the next step runs them, and the `RejectionSampler` verifies them in
place of the sampler (ref_engine/spec_decode.py). A step's time includes its proposing.

With a `kv_transfer_config`, the engine is one half of a disaggregated pair (lesson 3, ref_engine/disagg/):
a `"kv_producer"` saves each prompt's K/V through its KV connector in the step that computes it, and the
finished request's output carries the `kv_transfer_params`; a `"kv_consumer"` admits such a request with
`add_remote_prefilled_request`, loading its K/V into fresh blocks, and decodes it. Without one, nothing
in the loop changes.

Lesson: lessons/06-architecture-map.md (the engine loop); lessons/01-continuous-batching.md;
lessons/05-speculative-decoding.md (propose and verify); lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
(the KV connector's two roles).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from core.config import INT4_GROUP_SIZE, EngineConfig, ParallelConfig
from core.interfaces import ScheduledRequest, SchedulerInterface, SchedulerOutput, SchedulerStats, StepResult
from core.kv_cache_manager import PrefixCacheExplanation
from core.kv_sizing import with_swap_pool
from core.math_utils import cdiv
from core.metrics import StepRecord
from core.request import Request, RequestStatus, is_utf8_text
from core.scheduler import make_scheduler
from ref_engine.attention import check_kv_cache_dtype, kv_cache_torch_dtype
from ref_engine.detokenizer import IncrementalDetokenizer
from ref_engine.executor import make_executor
from ref_engine.kv_transfer.config import KVTransferConfig
from ref_engine.kv_transfer.connector import KVTransferParams, make_kv_connector
from ref_engine.model.loader import LoadedModel, check_float32_matmul_precision, load_model
from ref_engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from ref_engine.runner import ModelRunner, synchronize
from ref_engine.sampler import Sampler, SamplingMetadata, make_generator
from ref_engine.sampling_params import RequestOutputKind, SamplingParams
from ref_engine.spec_decode import Draft, RejectionSampler, load_draft_model, make_proposer
from ref_engine.worker.worker import WorkerConfig

PromptType = str | list[int] | dict[str, Any]
# A prompt dict's text labels: `tenant` (as authenticated: isolates the prefix cache, counted by tenant caps
# and the fair policy), `user` (the client's own label: groups requests for the fair policy when no tenant
# is given, never part of the cache key) and `cache_salt` (splits the cache further).
PROMPT_LABELS = ("tenant", "user", "cache_salt")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParsedPrompt:
    """A prompt as the engine takes it in (`LLMEngine._parse_prompt`): its token ids, its text when it came
    as text, and the `Request` fields a prompt dict may set beside it."""

    token_ids: list[int]
    text: str | None = None  # None: the prompt came as token ids
    tenant: str | None = None
    user: str | None = None
    cache_salt: str | None = None
    priority: int = 0


@dataclass
class _RequestState:
    """What the engine keeps beside the core's `Request`: text, the seeded generator, logprobs."""

    prompt: str | None
    generator: torch.Generator | None
    logprobs: list[dict[int, float]] | None
    stop_reason: int | str | None = None
    stop_text_end: int | None = None  # where a stop string cut the text
    draft_probs: torch.Tensor | None = None  # q of the draft tokens the request carries (None: point masses)
    kv_transfer_params: KVTransferParams | None = None  # a producer's saved KV of the prompt
    kv_load_s: float = 0.0  # a consumer's seconds loading the K/V a producer saved
    detokenizer: IncrementalDetokenizer | None = None  # a streamed (DELTA) request's text sent so far


class LLMEngine:
    scheduler: SchedulerInterface  # the core's scheduler, reached through its declared methods only

    def __init__(self, model: str | Path | LoadedModel | None = None, *, dtype: str | torch.dtype = "float32",
                 device: str | torch.device | None = None, config: EngineConfig | None = None,
                 kv_transfer_config: KVTransferConfig | None = None, quantization: str | None = None,
                 quantization_group_size: int | None = None, kv_cache_dtype: str = "auto",
                 enforce_eager: bool = True, float32_matmul_precision: str = "highest", **knobs: Any) -> None:
        """`model`: a path, None for the default SmolLM2, or an already `LoadedModel` (so sweeps load the
        weights once and build one engine per configuration; it comes quantized or not). `kv_transfer_config`:
        this engine's role in a disaggregated pair, if any. `quantization`: None (the float reference),
        "int8" or "int4" (both weight-only), ref_engine/model/quantization.py. `quantization_group_size`: weights
        per int4 scale and zero for a model quantized at load (None: 32; a GGUF's Q4_1 blocks keep their own
        32, so only 32 is taken there). `kv_cache_dtype`: "auto" (the model's dtype) or
        a dtype to store K/V in (ref_engine/attention.py; "bfloat16" doubles the blocks a pool holds).
        `enforce_eager`: True (the default: on the course CPU compiling did not pay, benchmarks/RESULTS.md)
        runs the model eagerly; False compiles its forward at start (ref_engine/model/compile.py), or on a GPU
        replays decode steps from CUDA graphs (ref_engine/cuda_graphs.py, `cudagraph_capture_sizes`).
        `float32_matmul_precision`: "highest" (the default) or "high", TF32 for float32 matmuls on a GPU
        (refused elsewhere; `loader.check_float32_matmul_precision`).
        `knobs`: `EngineConfig`'s and `ParallelConfig`'s (`tensor_parallel_size=2` runs the model on two worker
        processes, ref_engine/executor/; the workers stop with `shutdown()`, or when the engine is collected or
        its process exits)."""
        parallel_config = ParallelConfig(**{f.name: knobs.pop(f.name) for f in fields(ParallelConfig)
                                            if f.name in knobs})
        if kv_transfer_config is not None and parallel_config.distributed_executor_backend != "uni":
            raise ValueError(f"kv_transfer_config saves and loads K/V in the engine's own process; got "
                             f"tensor_parallel_size={parallel_config.tensor_parallel_size}, distributed_executor_backend="
                             f"{parallel_config.distributed_executor_backend!r} (a disaggregated engine takes 1 and 'uni')")
        config = config or EngineConfig()
        self.config = config.replace(**knobs) if knobs else config
        check_kv_cache_dtype(kv_cache_dtype)  # before the slow load
        if not isinstance(enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {enforce_eager!r}")
        if quantization_group_size is not None and quantization != "int4":
            raise ValueError(f"quantization_group_size={quantization_group_size!r} sizes int4's groups; it needs "
                             f"quantization='int4', got quantization={quantization!r}")
        if isinstance(model, LoadedModel):
            if quantization_group_size is not None:
                raise ValueError("quantization_group_size applies when the engine loads the model; the given "
                                 "LoadedModel is already loaded (pass load_model(..., quantization_group_size=...))")
            if quantization != model.quantization and quantization is not None:
                raise ValueError(f"quantization={quantization!r}, but the given LoadedModel was loaded with "
                                 f"quantization={model.quantization!r} (pass load_model(..., quantization=...))")
            loaded = model
            self.device = next(model.model.parameters()).device
            check_float32_matmul_precision(float32_matmul_precision, next(model.model.parameters()).dtype,
                                           self.device)
        else:
            self.device = torch.device(device) if device else torch.device(
                "cuda" if torch.cuda.is_available() else "cpu")
            check_float32_matmul_precision(float32_matmul_precision, dtype, self.device)  # before the slow load
            loaded = load_model(model, dtype=dtype, device=self.device, quantization=quantization,
                                quantization_group_size=(INT4_GROUP_SIZE if quantization_group_size is None
                                                         else quantization_group_size))
        self.model_id = loaded.model_id
        self.arch = loaded.arch
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.config = self.config.for_model(self.arch.max_position_embeddings)
        self.dtype = next(loaded.model.parameters()).dtype
        self.kv_cache_dtype = kv_cache_torch_dtype(kv_cache_dtype, self.dtype)
        # the host pool for swapping (`swap_space`: GiB over all ranks), settled before the workers see the config
        block_bytes = self.arch.kv_bytes_per_block(self.config.block_size, self.kv_cache_dtype.itemsize)
        self.config = with_swap_pool(self.config, block_bytes, host_memory=host_memory_bytes())
        self.parallel_config = parallel_config
        # a draft model loads first: its pool shares the target's block ids, so the sizing counts it too
        draft = load_draft_model(self.config, loaded, dtype=self.dtype, device=self.device)
        draft_footprint = None if draft is None else draft.footprint(self.config.block_size, self.dtype)
        self.model_executor = make_executor(WorkerConfig(
            loaded.path, self.dtype, loaded.quantization, self.kv_cache_dtype, self.config, parallel_config,
            self.device, enforce_eager, float32_matmul_precision, draft=draft_footprint), loaded)
        try:  # the workers must not outlive an engine that fails to start
            self.num_kv_blocks = self.model_executor.determine_num_kv_blocks()
            self.cache_namespace = cache_namespace(loaded, self.dtype, self.kv_cache_dtype)
            self.scheduler = make_scheduler(self.config, self.num_kv_blocks, cache_namespace=self.cache_namespace,
                                            explain_misses=True)
            self.model_executor.initialize_cache(self.num_kv_blocks, self.scheduler.num_swap_blocks)
            self.sampler = Sampler(self.config.seed, self.device)
            self.rejection_sampler = RejectionSampler(self.sampler)
            self.proposer = make_proposer(self.config, draft, self.sampler, num_kv_blocks=self.num_kv_blocks,
                                          dtype=self.dtype, device=self.device)
        except BaseException:
            self.model_executor.shutdown()
            raise
        self.kv_connector = make_kv_connector(kv_transfer_config) if kv_transfer_config else None
        self._kv_producer = kv_transfer_config is not None and kv_transfer_config.is_kv_producer
        self._states: dict[str, _RequestState] = {}
        self._shut_down = False
        self.step_records: list[StepRecord] = []
        self._t0 = time.perf_counter()

    @property
    def runner(self) -> ModelRunner | None:
        """The model runner in the engine's process (distributed_executor_backend="uni"), whose KV cache a
        KV connector saves from and loads into. None with "mp", whose runners live in the worker processes,
        and once the engine is shut down."""
        worker = self.model_executor.driver_worker
        return None if worker is None else worker.model_runner

    # ---- clock ----

    def now(self) -> float:
        """Seconds since the engine started or `reset_clock` was called (the clock of all timestamps)."""
        return time.perf_counter() - self._t0

    def reset_clock(self) -> None:
        """Start a new measurement: time 0 is now and the step log is cleared."""
        self._t0 = time.perf_counter()
        self.step_records = []

    # ---- requests ----

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> Request:
        """Validate and queue one request; bad input raises ValueError naming what is wrong, and the engine
        goes on serving the others."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        params.validate_for_vocab(self.arch.vocab_size)
        request, text = self._make_request(request_id, prompt, params, arrival_time)
        self._enqueue(request, text)
        return request

    def _make_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                      arrival_time: float | None = None) -> tuple[Request, str | None]:
        self._check_open()
        parsed = self._parse_prompt(prompt)
        request = Request(
            request_id=request_id, prompt_token_ids=parsed.token_ids, max_tokens=params.max_tokens,
            arrival_time=self.now() if arrival_time is None else arrival_time,
            eos_token_ids=self.eos_token_ids, stop_token_ids=frozenset(params.stop_token_ids),
            ignore_eos=params.ignore_eos, min_tokens=params.min_tokens, tenant=parsed.tenant, user=parsed.user,
            cache_salt=parsed.cache_salt, priority=parsed.priority, sampling_params=params)
        return request, parsed.text

    def explain_prefix_cache(self, prompt: PromptType) -> PrefixCacheExplanation:
        """How many of this prompt's tokens the prefix cache would serve right now, and why the next block
        would miss (different tokens, another tenant or salt, evicted, ...). Changes nothing."""
        request, _ = self._make_request("explain", prompt, SamplingParams())
        return self.scheduler.explain_prefix(request)

    def add_workload_request(self, request: Request) -> None:
        """Queue a core `Request` built by `Workload.make_requests`: greedy, exactly `max_tokens` tokens."""
        self._check_open()
        request.sampling_params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=True)
        self._enqueue(request, None)

    def add_remote_prefilled_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                                     kv_transfer_params: KVTransferParams) -> Request | None:
        """Consumer: admit a request that a producer engine prefilled, writing the K/V it saved
        (`kv_transfer_params`, from the producer's output) into blocks of this engine's own. The next step
        recomputes only the last prompt token and samples the first output token.

        Returns None, changing nothing, while the request cannot start (busy or short of free blocks: call
        again after a step); raises ValueError if it never could (refused as by `add_request`), and the
        connector's error if loading fails (the request's blocks are freed first)."""
        if self.kv_connector is None or self._kv_producer:
            raise ValueError("only an engine with kv_transfer_config(kv_role='kv_consumer') loads remote KV")
        params.validate_for_vocab(self.arch.vocab_size)
        request, text = self._make_request(request_id, prompt, params)
        if kv_transfer_params.cache_namespace != self.cache_namespace:
            raise ValueError(f"request {request_id!r}: its KV was computed under cache namespace "
                             f"{kv_transfer_params.cache_namespace!r}, this engine's is {self.cache_namespace!r} "
                             "(another model, weights, dtype, quantization, KV-cache dtype or tokenizer)")
        if kv_transfer_params.num_tokens != request.num_prompt_tokens - 1:
            raise ValueError(f"request {request_id!r}: KV of {kv_transfer_params.num_tokens} tokens arrived for "
                             f"a prompt of {request.num_prompt_tokens} (expected all but the last)")
        block_ids = self.scheduler.add_remote_prefilled_request(request, kv_transfer_params.num_tokens, self.now())
        if block_ids is None:
            return None
        load_start = time.perf_counter()
        try:
            self.kv_connector.load(kv_transfer_params, self.runner.kv_caches, block_ids)
        except BaseException:
            self.scheduler.abort_request(request_id, self.now())
            raise
        self._add_state(request, text)
        self._states[request_id].kv_load_s = time.perf_counter() - load_start
        return request

    def _check_open(self) -> None:
        if self._shut_down:
            raise RuntimeError("this engine was shut down (shutdown()); build a new one")

    def _enqueue(self, request: Request, text: str | None) -> None:
        self.scheduler.add_request(request)
        self._add_state(request, text)

    def _add_state(self, request: Request, text: str | None) -> None:
        params = request.sampling_params
        self._states[request.request_id] = _RequestState(
            prompt=text,
            generator=make_generator(params.seed, self.device) if params.seed is not None else None,
            logprobs=[] if params.logprobs is not None else None,
            detokenizer=(IncrementalDetokenizer(self.tokenizer, params.stop)
                         if params.output_kind is RequestOutputKind.DELTA else None))

    def abort_request(self, request_id: str) -> None:
        if self.scheduler.abort_request(request_id, self.now()) is not None:
            self._states.pop(request_id, None)
            if self.proposer is not None:
                self.proposer.free(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_request(self, request_id: str) -> Request | None:
        """The unfinished request with this id, or None."""
        return self.scheduler.get_request(request_id)

    def unfinished_request_ids(self) -> list[str]:
        return self.scheduler.unfinished_request_ids()

    def running_request_ids(self) -> list[str]:
        """The running batch's request ids, in admission order."""
        return self.scheduler.running_request_ids()

    def make_stats(self) -> SchedulerStats:
        """The scheduler's queues, pool and preemption totals now (a server's gauges)."""
        return self.scheduler.make_stats()

    def reset_prefix_cache(self, tenant: str | None = None) -> bool:
        """Forget the prefix cache (vLLM's name), or only the blocks `tenant`'s requests cached; never
        refused, even under load: no request hits a forgotten block from now on, and blocks still in use are
        freed when their requests finish. Returns True."""
        if tenant is not None and not (is_utf8_text(tenant) and tenant):
            raise ValueError(f"tenant must be a non-empty string of valid Unicode text, got {tenant!r}")
        self.scheduler.reset_prefix_cache(tenant)
        return True

    def shutdown(self) -> None:
        """Abort what is unfinished, free the KV pools and drop the model, so that the next engine in this
        process sizes its pool from the memory this one held: on CUDA torch's caching allocator would keep
        it reserved, and `empty_cache` gives it back. Idempotent; the engine takes no requests afterwards."""
        for request_id in list(self._states):
            self.abort_request(request_id)
        self.model_executor.shutdown()  # its workers drop their runners and models (processes: they exit)
        self.proposer = None
        self._shut_down = True
        gc.collect()  # the model's modules may sit in reference cycles
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- the loop ----

    def step(self, now: float | None = None) -> list[RequestOutput]:
        """Schedule, run the model, sample, update; returns the requests that finished in this step, and
        this step's delta of every streamed request still running.

        `now`: the clock reading at which the caller last added arriving requests (ref_engine/bench.py), the
        step's recorded start. A replay of the run in the simulator starts each step there and admits what
        had arrived by then: exactly what the engine had been given, even when a request arrived in the few
        microseconds between the caller's look and this call."""
        start = self.now() if now is None else now
        output = self.scheduler.schedule(start)
        if output.is_empty:
            return []
        model_output = self.model_executor.execute_model(output)
        if self._kv_producer:
            self._save_kv(output)
        sampled, errors = (self._sample(output, model_output.request_ids, model_output.logits)
                           if model_output.request_ids else ({}, {}))
        synchronize(self.device)  # the step's time is read next: it must include the device's work
        end = self.now()
        failed = [self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED, end)
                  for request_id in errors]
        result = StepResult(sampled)
        finished = self.scheduler.update_from_output(output, result, end)
        done = {r.request_id for r in finished}
        finished += self._per_request("stop strings", lambda r: self._check_stop_string(r, len(sampled[r]), end),
                                      [r for r in sampled if r not in done], errors)
        failed += self._fail(errors, end)
        if self.proposer is not None:
            self._propose()
        self.step_records.append(StepRecord.from_output(output, start, self.now() - start, result))
        done = {r.request_id for r in finished + failed}
        streamed = self._per_request("streaming", self._stream, [r for r in sampled if r not in done
                                                                 and self._states[r].detokenizer is not None],
                                     errors)
        failed += self._fail(errors, end)
        return streamed + [self._finish(r) for r in finished] + [self._finish(r, errors[r.request_id])
                                                                 for r in failed]

    def _per_request(self, what: str, work: Callable[[str], Any], request_ids: list[str],
                     errors: dict[str, str]) -> list[Any]:
        """`work(request_id)` for each request, keeping what is not None; a request whose work raises gets
        its error in `errors` (to be failed alone) instead of ending the step for everyone."""
        results = []
        for request_id in request_ids:
            try:
                result = work(request_id)
            except Exception as error:
                logger.exception("request %s failed in %s", request_id, what)
                errors[request_id] = f"{what} failed: {type(error).__name__}: {error}"
                continue
            if result is not None:
                results.append(result)
        return results

    def _fail(self, errors: dict[str, str], now: float) -> list[Request]:
        """End the requests in `errors` that are still running (aborted, their error kept for the output)."""
        return [r for r in (self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED, now)
                            for request_id in errors if self.scheduler.get_request(request_id) is not None)
                if r is not None]

    def _sample(self, output: SchedulerOutput, request_ids: list[str], logits: torch.Tensor
                ) -> tuple[dict[str, list[int]], dict[str, str]]:
        """(new tokens per request, error per request that could not be sampled). When the batch raises,
        each request is sampled on its own to pin the error on the one(s) that raise."""
        try:
            return self._sample_batch(output, request_ids, logits), {}
        except Exception:
            scheduled = {s.request_id: s for s in output.scheduled}
            sampled, errors = {}, {}
            row = 0
            for request_id in request_ids:
                num_rows = scheduled[request_id].num_draft_tokens + 1
                try:
                    sampled |= self._sample_batch(output, [request_id], logits[row:row + num_rows])
                except Exception as error:
                    logger.exception("request %s failed in sampling", request_id)
                    errors[request_id] = f"sampling failed: {type(error).__name__}: {error}"
                row += num_rows
            if not errors:  # only the batch as a whole raised: not one request's fault
                raise
            return sampled, errors

    def _sample_batch(self, output: SchedulerOutput, request_ids: list[str], logits: torch.Tensor
                      ) -> dict[str, list[int]]:
        """New tokens per request: the sampler's one, or the verified drafts plus one when it had drafts."""
        scheduled = {s.request_id: s for s in output.scheduled}
        requests = [self.scheduler.get_request(r) for r in request_ids]
        rows = [(r, j) for r in requests for j in range(scheduled[r.request_id].num_draft_tokens + 1)]
        meta = SamplingMetadata.build(
            [r.sampling_params for r, _ in rows], [self._states[r.request_id].generator for r, _ in rows],
            [r.num_output_tokens + j for r, j in rows], set(self.eos_token_ids), self.device)
        if len(rows) == len(requests):
            sample = self.sampler(logits, meta)
            emitted = [[token_id] for token_id in sample.sampled_token_ids.tolist()]
        else:
            emitted, sample = self.rejection_sampler(logits, meta, [self._draft(scheduled[r.request_id])
                                                                    for r in requests])
        sampled = {}
        row = 0
        for request, token_ids in zip(requests, emitted):
            sampled[request.request_id] = token_ids
            for j, token_id in enumerate(token_ids):
                self._record_logprobs(request, row + j, token_id, sample)
            row += scheduled[request.request_id].num_draft_tokens + 1
        return sampled

    def _save_kv(self, output: SchedulerOutput) -> None:
        """Producer: save the K/V of every prompt this step completed (all but its last token, which the
        consumer recomputes), now, while its blocks are still the request's: with max_tokens=1 it finishes
        in this very step and its blocks go back to the pool."""
        block_size = self.config.block_size
        for s in output.scheduled:
            request = self.scheduler.get_request(s.request_id)
            if s.needs_logits and not request.num_output_tokens:
                num_tokens = request.num_prompt_tokens - 1
                params = self.kv_connector.save(s.request_id, self.runner.kv_caches,
                                                s.block_ids[:cdiv(num_tokens, block_size)], num_tokens)
                self._states[s.request_id].kv_transfer_params = replace(params, cache_namespace=self.cache_namespace)

    def _draft(self, scheduled: ScheduledRequest) -> Draft:
        """The draft a scheduled request verifies (the budget may have cut it short)."""
        n = scheduled.num_draft_tokens
        probs = self._states[scheduled.request_id].draft_probs
        return Draft(scheduled.token_ids[len(scheduled.token_ids) - n:], None if probs is None else probs[:n])

    def _propose(self) -> None:
        """Draft tokens for the next step, for the requests the scheduler lets speculate."""
        candidates = self.scheduler.requests_to_speculate()
        if not candidates:
            return
        requests = [r for r, _ in candidates]
        drafts = self.proposer.propose(requests, [k for _, k in candidates],
                                       [self._states[r.request_id].generator for r in requests])
        self.scheduler.update_draft_token_ids({r.request_id: d.token_ids for r, d in zip(requests, drafts)})
        for request, draft in zip(requests, drafts):
            self._states[request.request_id].draft_probs = draft.probs

    # ---- helpers ----

    def _parse_prompt(self, prompt: PromptType) -> ParsedPrompt:
        """A str, a list of ids or a dict in vLLM's shape, as token ids (and text) with the dict's tenant,
        user, cache_salt and priority. Text that is not valid Unicode is refused here, naming its
        key, so nothing computed from it later (the prefix-cache key, a tokenization) can raise."""
        fields: dict[str, Any] = {}
        if isinstance(prompt, dict):
            unknown = set(prompt) - {"prompt", "prompt_token_ids", *PROMPT_LABELS, "priority"}
            if unknown:
                raise ValueError(f"prompt dict has unknown key(s) {sorted(unknown)}; expected 'prompt' or "
                                 "'prompt_token_ids', optionally 'tenant', 'user', 'cache_salt' and 'priority'")
            for key in PROMPT_LABELS:
                value = prompt.get(key)
                if value is not None and not (is_utf8_text(value) and value):
                    raise ValueError(f"prompt dict's {key!r} must be a non-empty string of valid Unicode text "
                                     f"(no lone surrogates), got {value!r}")
                fields[key] = value
            fields["priority"] = prompt.get("priority", 0)
            if not isinstance(fields["priority"], int) or isinstance(fields["priority"], bool):
                raise ValueError(f"prompt dict's 'priority' must be an integer, got {fields['priority']!r}")
            if "prompt_token_ids" in prompt:
                prompt = prompt["prompt_token_ids"]
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("prompt dict needs a 'prompt' or a 'prompt_token_ids' key")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            if not is_utf8_text(prompt):
                raise ValueError("prompt is not valid Unicode text (it holds a lone surrogate)")
            return ParsedPrompt(self.tokenizer.encode(prompt), prompt, **fields)
        if isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            if not ids:
                raise ValueError("prompt_token_ids is empty")
            bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.arch.vocab_size]
            if bad:
                raise ValueError(f"prompt_token_ids has ids outside the vocabulary [0, {self.arch.vocab_size}): "
                                 f"{bad[:5]}")
            return ParsedPrompt(ids, **fields)
        raise ValueError(f"a prompt must be a str, a list of token ids or a dict, got {type(prompt).__name__}")

    def _record_logprobs(self, request: Request, row: int, token_id: int, sample: Any) -> None:
        logprobs = self._states[request.request_id].logprobs
        if logprobs is None:
            return
        entry = {token_id: float(sample.logprobs[row])}
        n = request.sampling_params.logprobs
        if n and sample.top_logprobs is not None:
            values, ids = sample.top_logprobs
            entry.update({int(i): float(v) for i, v in zip(ids[row, :n].tolist(), values[row, :n].tolist())})
        logprobs.append(entry)

    def _check_stop_string(self, request_id: str, num_new: int, now: float) -> Request | None:
        """End the request if its text now contains one of its stop strings (the core sees only ids);
        `num_new`: the tokens this step gave it. Returns it if it ended."""
        request = self.scheduler.get_request(request_id)
        if request is None or not request.sampling_params.stop:
            return None
        text = self.tokenizer.decode(request.output_token_ids)
        if not any(s in text for s in request.sampling_params.stop):
            return None
        keep, text = self._cut_at_stop(request, num_new)
        index, stop = min((text.find(s), s) for s in request.sampling_params.stop if s in text)
        state = self._states[request_id]
        state.stop_reason = stop
        state.stop_text_end = index + len(stop) if request.sampling_params.include_stop_str_in_output else index
        return self.scheduler.finish_request(request_id, RequestStatus.FINISHED_STOPPED, now, num_output_tokens=keep)

    def _cut_at_stop(self, request: Request, num_new: int) -> tuple[int, str]:
        """How many output tokens to keep: up to the first of this step's tokens that completes a stop
        string, as if they had come one per step (a verify step emits several); and the text of those."""
        stops = request.sampling_params.stop
        out = request.output_token_ids
        for keep in range(len(out) - num_new + 1, len(out) + 1):
            text = self.tokenizer.decode(out[:keep])
            if any(s in text for s in stops):
                return keep, text
        raise AssertionError("a stop string was found in the whole text but in none of its prefixes")

    def _stream(self, request_id: str) -> RequestOutput:
        """A running streamed request's new tokens and text since its last output."""
        request = self.scheduler.get_request(request_id)
        state = self._states[request_id]
        logprobs = _new_logprobs(state)
        token_ids, text = state.detokenizer.delta(request.output_token_ids)
        completion = CompletionOutput(index=0, text=text, token_ids=token_ids, finish_reason=None,
                                      logprobs=logprobs)
        return self._output(request, state, completion, finished=False)

    def _finish(self, request: Request, error: str | None = None) -> RequestOutput:
        """The finished request's output (its last delta, if streamed); `error`: why the engine failed it.
        Never raises: if the output itself cannot be made, the request fails with that error and no text."""
        state = self._states.pop(request.request_id)
        if self.proposer is not None:
            self.proposer.free(request.request_id)
        try:
            completion = self._final_completion(request, state, error)
        except Exception as failure:
            logger.exception("request %s failed in its final output", request.request_id)
            error = error or f"final output failed: {type(failure).__name__}: {failure}"
            completion = CompletionOutput(index=0, text="", token_ids=[], finish_reason="error")
        output = self._output(request, state, completion, finished=True)
        output.error = error
        return output

    def _final_completion(self, request: Request, state: _RequestState, error: str | None) -> CompletionOutput:
        if state.logprobs is not None:  # a verify step may have scored tokens past the one that stopped it
            del state.logprobs[request.num_output_tokens:]
        text = self.tokenizer.decode(request.output_token_ids)
        stop_reason = state.stop_reason
        if state.stop_text_end is not None:
            text = text[: state.stop_text_end]
        elif request.status is RequestStatus.FINISHED_STOPPED and request.output_token_ids:
            last = request.output_token_ids[-1]
            stop_reason = last if last in request.stop_token_ids else None
        token_ids, logprobs = list(request.output_token_ids), state.logprobs
        if state.detokenizer is not None:  # streamed: only what was not sent yet
            logprobs = _new_logprobs(state)
            token_ids, text = state.detokenizer.delta(token_ids, final_text=text)
        return CompletionOutput(index=0, text=text, token_ids=token_ids,
                                finish_reason="error" if error else request.status.finish_reason,
                                stop_reason=stop_reason, logprobs=logprobs)

    def _output(self, request: Request, state: _RequestState, completion: CompletionOutput,
                finished: bool) -> RequestOutput:
        explanation = metrics = None
        if finished:
            explanation = self.scheduler.take_prefix_cache_explanation(request.request_id)
            metrics = RequestMetrics(arrival_time=request.arrival_time,
                                     first_scheduled_time=request.first_scheduled_time,
                                     first_token_time=request.first_token_time, finished_time=request.finish_time,
                                     token_times=list(request.token_times), kv_load_s=state.kv_load_s)
        return RequestOutput(request_id=request.request_id, prompt=state.prompt,
                             prompt_token_ids=request.prompt_token_ids, outputs=[completion], finished=finished,
                             num_preemptions=request.num_preemptions,
                             num_cached_tokens=request.num_cached_tokens or 0, prefix_cache=explanation,
                             kv_transfer_params=state.kv_transfer_params, metrics=metrics)


def _new_logprobs(state: _RequestState) -> list[dict[int, float]] | None:
    """A streamed request's logprobs of the tokens not sent yet (call before `detokenizer.delta`)."""
    return None if state.logprobs is None else state.logprobs[state.detokenizer.num_sent_tokens:]


def cache_namespace(loaded: LoadedModel, dtype: torch.dtype, kv_cache_dtype: torch.dtype) -> str:
    """Everything an engine's K/V depends on besides the tokens, as the prefix cache's namespace: the model's
    name and weights digest, the compute dtype, the quantization, the KV-cache dtype and the tokenizer."""
    return (f"{loaded.model_id}|weights={loaded.weights_digest}|dtype={str(dtype).removeprefix('torch.')}"
            f"|quantization={loaded.quantization}|kv_cache_dtype={str(kv_cache_dtype).removeprefix('torch.')}"
            f"|tokenizer={loaded.tokenizer.fingerprint}")


def host_memory_bytes() -> int:
    """This host's physical memory, which the swap pool (`swap_space`) is checked against."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class LLM:
    """Offline batch generation: `LLM(**knobs).generate(prompts, SamplingParams(...))`. Close it with
    `shutdown()` or use it as a context manager (`with LLM(...) as llm:`) before building the next one."""

    def __init__(self, model: str | Path | LoadedModel | None = None, *, dtype: str | torch.dtype = "float32",
                 device: str | torch.device | None = None, **knobs: Any) -> None:
        """`model`: as `LLMEngine`'s (a path or name, None for the default, or a `LoadedModel`)."""
        self.llm_engine = LLMEngine(model, dtype=dtype, device=device, **knobs)
        self._next_id = 0

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def shutdown(self) -> None:
        """Free the engine's KV pools and model (`LLMEngine.shutdown`)."""
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def generate(self, prompts: PromptType | list[PromptType],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion with continuous batching; outputs come back in prompt order."""
        prompts, params = as_batch(prompts, sampling_params)
        engine = self.llm_engine
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                ids.append(str(self._next_id))
                self._next_id += 1
                engine.add_request(ids[-1], prompt, p)
        except ValueError as error:
            for request_id in ids:
                engine.abort_request(request_id)
            raise ValueError(f"prompt {len(ids) - 1}: {error}") from None
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm, unit="req") as bar:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    results[out.request_id] = out
                    bar.update(1)
        return [results[i] for i in ids]


def as_batch(prompts: PromptType | list[PromptType], sampling_params: SamplingParams | list[SamplingParams] | None
             ) -> tuple[list[PromptType], list[SamplingParams]]:
    """`generate`'s arguments as one list of prompts and one SamplingParams per prompt."""
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not prompts:
        raise ValueError("prompts is empty")
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return list(prompts), [sampling_params or SamplingParams()] * len(prompts)
    params = list(sampling_params)
    if len(params) != len(prompts):
        raise ValueError(f"got {len(params)} sampling_params for {len(prompts)} prompts")
    return list(prompts), params
