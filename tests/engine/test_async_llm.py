"""`AsyncLLM` against a live engine-core process (tiny model): a failing request fails alone, a refused one
says why, a bad utility call raises in its caller only, and shutdown ends the streams still open; latencies
start at the API server's arrival; preemptions are counted as they happen; a request that breaks a step
or its output's handling fails alone. (Streams, aborts and metrics are tested end to end
through the HTTP server in tests/serving_lab/test_server.py.)
"""

from __future__ import annotations

import asyncio
import time

import pytest
from engine_core_faults import POISON_MIN_P, PoisonedEngineArgs

from ref_engine import SamplingParams
from ref_engine.async_engine.async_llm import AsyncLLM, EngineGenerateError
from ref_engine.engine_core.client import EngineDeadError

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


async def collect(llm: AsyncLLM, params: SamplingParams, request_id: str) -> list:
    return [out async for out in llm.generate({"prompt_token_ids": [1, 2, 3]}, params, request_id)]


def test_failures_stay_with_their_request_and_shutdown_ends_open_streams(make_tiny_hf_model, device):
    tiny = make_tiny_hf_model("llama", name="async-llama")
    llm = AsyncLLM(PoisonedEngineArgs(str(tiny), device=device, num_threads=1))

    async def run():
        await llm.start()
        poisoned = SamplingParams(max_tokens=8, temperature=1.0, min_p=POISON_MIN_P)
        ok_1, bad, ok_2 = await asyncio.gather(collect(llm, GREEDY, "ok-1"), collect(llm, poisoned, "bad"),
                                               collect(llm, GREEDY, "ok-2"), return_exceptions=True)
        assert isinstance(bad, EngineGenerateError) and "injected" in str(bad) and not bad.invalid
        assert [sum(len(o.outputs[0].token_ids) for o in ok) for ok in (ok_1, ok_2)] == [8, 8]

        with pytest.raises(EngineGenerateError, match="stop_token_ids") as refused:  # refused by the core
            await collect(llm, SamplingParams(stop_token_ids=[10_000]), "refused")
        assert refused.value.invalid
        with pytest.raises(RuntimeError, match="unknown utility method"):  # answered, and the core serves on
            await llm.client.call_utility("no_such_method")
        assert await llm.reset_prefix_cache() is True

        stream = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=200, ignore_eos=True),
                              "long")
        assert not (await anext(stream)).finished
        await llm.shutdown()
        with pytest.raises(EngineGenerateError, match="shutting down"):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await anext(llm.generate({"prompt_token_ids": [1]}, GREEDY, "late"))

    asyncio.run(run())
    assert not llm.client.is_alive()


def sample(llm: AsyncLLM, name: str) -> float:
    return llm.stat_logger.registry.get_sample_value(name, {"model_name": llm.model_name}) or 0.0


def test_latency_starts_at_the_api_servers_arrival_and_preemptions_count_when_they_happen(make_tiny_hf_model, device):
    """TTFT and e2e latency run from the arrival the API server stamps (carried across processes), not from
    when the core sees the request. A preemption is counted as it happens (each request once), not when the
    preempted request finishes, and the gauge shows requests waiting after one."""
    tiny = make_tiny_hf_model("llama", name="async-preempt-llama")
    llm = AsyncLLM(PoisonedEngineArgs(str(tiny), device=device, num_threads=1, engine_kwargs={"num_kv_blocks": 16}))
    long = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)

    async def run():
        await llm.start()
        await collect(llm, GREEDY, "warm")
        ttft_before = sample(llm, "vllm:time_to_first_token_seconds_sum")
        e2e_before = sample(llm, "vllm:e2e_request_latency_seconds_sum")
        outputs = [o async for o in llm.generate({"prompt_token_ids": [1, 2, 3]}, GREEDY, "early",
                                                 arrival_time=time.perf_counter() - 5.0)]
        assert outputs[-1].finished
        assert sample(llm, "vllm:time_to_first_token_seconds_sum") - ttft_before >= 5.0
        assert sample(llm, "vllm:e2e_request_latency_seconds_sum") - e2e_before >= 5.0

        # 6 prompts of 40 tokens (3 blocks each) growing to 140 (9 blocks) in a pool of 16 blocks
        seen, finished_preempted = [], 0

        async def one(i: int) -> None:
            nonlocal finished_preempted
            prompt = {"prompt_token_ids": [(7 * i + j) % 200 + 1 for j in range(40)]}
            async for output in llm.generate(prompt, long, f"p{i}"):
                if output.finished and output.num_preemptions:
                    finished_preempted += 1
                seen.append((sample(llm, "serving_lab:preempted_requests_total"), finished_preempted,
                             sample(llm, "serving_lab:num_requests_waiting_preempted")))

        await asyncio.gather(*(one(i) for i in range(6)))
        counted, events = sample(llm, "serving_lab:preempted_requests_total"), sample(llm, "vllm:num_preemptions_total")
        assert 1 <= counted <= 6 and events >= counted and counted == finished_preempted
        assert any(now > done for now, done, _ in seen), "preemptions were counted only as requests finished"
        assert max(waiting for _, _, waiting in seen) >= 1
        assert sample(llm, "serving_lab:num_requests_waiting_preempted") == 0
        await llm.shutdown()

    asyncio.run(run())


def test_a_request_that_breaks_the_step_or_its_output_fails_alone(make_tiny_hf_model, device):
    """A lone surrogate in `cache_salt` reaches no engine through the API server (a 400 there); sent to
    the core directly it either is refused at add_request or breaks the step that would hash it. Either
    way only that request fails and the loop serves on. Likewise an output this process fails to handle
    fails its own request only."""
    tiny = make_tiny_hf_model("llama", name="async-robust-llama")
    llm = AsyncLLM(PoisonedEngineArgs(str(tiny), device=device, num_threads=1, engine_kwargs={"num_kv_blocks": 64}))
    long = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)

    async def run():
        await llm.start()
        running = llm.generate({"prompt_token_ids": [1, 2, 3]}, long, "running")
        first = await anext(running)
        with pytest.raises(EngineGenerateError):
            await collect_prompt(llm, {"prompt_token_ids": list(range(1, 40)), "cache_salt": "\ud800"}, "bad")
        rest = [o async for o in running]
        assert sum(len(o.outputs[0].token_ids) for o in [first, *rest]) == 60 and rest[-1].finished

        record_output = llm.stat_logger.record_output

        def broken_for_one(output, first):
            if output.request_id == "unlucky":
                raise RuntimeError("a bug in handling one output")
            record_output(output, first)

        llm.stat_logger.record_output = broken_for_one
        lucky, unlucky = await asyncio.gather(collect(llm, GREEDY, "lucky"), collect(llm, GREEDY, "unlucky"),
                                              return_exceptions=True)
        assert isinstance(unlucky, EngineGenerateError) and sum(len(o.outputs[0].token_ids) for o in lucky) == 8
        assert llm.dead_error is None and len(await collect(llm, GREEDY, "after")) >= 1
        await llm.shutdown()

    asyncio.run(run())


async def collect_prompt(llm: AsyncLLM, prompt: dict, request_id: str) -> list:
    return [out async for out in llm.generate(prompt, GREEDY, request_id)]
