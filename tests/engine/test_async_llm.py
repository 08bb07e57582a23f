"""`AsyncLLM` against a live engine-core process (tiny model): a failing request fails alone, a refused one
says why, a bad utility call raises in its caller only, and shutdown ends the streams still open. (Streams, aborts and metrics are tested end to end
through the HTTP server in tests/serving_lab/test_server.py.)
"""

from __future__ import annotations

import asyncio

import pytest
from engine_core_faults import POISON_MIN_P, PoisonedEngineArgs

from ref_engine import SamplingParams
from ref_engine.async_engine.async_llm import AsyncLLM, EngineGenerateError
from ref_engine.async_engine.core_client import EngineDeadError

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


async def collect(llm: AsyncLLM, params: SamplingParams, request_id: str) -> list:
    return [out async for out in llm.generate({"prompt_token_ids": [1, 2, 3]}, params, request_id)]


def test_failures_stay_with_their_request_and_shutdown_ends_open_streams(make_tiny_hf_model):
    tiny = make_tiny_hf_model("llama", name="async-llama")
    llm = AsyncLLM(PoisonedEngineArgs(str(tiny), num_threads=1))

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
