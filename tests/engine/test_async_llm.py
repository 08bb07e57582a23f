"""`AsyncLLM` against a live engine-core process (tiny model): streams, abort, a failing request, shutdown.

One engine core serves the whole module; every test runs its coroutines on the module's event loop.
"""

from __future__ import annotations

import asyncio

import pytest
from engine_core_faults import POISON_MIN_P, PoisonedEngineArgs

from ref_engine import LLM, SamplingParams
from ref_engine.async_engine.async_llm import AsyncLLM, EngineGenerateError
from ref_engine.async_engine.core_client import EngineDeadError

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return make_tiny_hf_model("llama", name="async-llama")


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def llm(tiny, loop):
    llm = AsyncLLM(PoisonedEngineArgs(str(tiny), num_threads=1, engine_kwargs={"num_kv_blocks": 64}))
    loop.run_until_complete(llm.start())
    yield llm
    loop.run_until_complete(llm.shutdown())


def used_blocks_fraction(llm: AsyncLLM) -> float:
    return llm.stat_logger.registry.get_sample_value("vllm:kv_cache_usage_perc", {"model_name": llm.model_name})


def gather(loop: asyncio.AbstractEventLoop, *coroutines, return_exceptions: bool = False) -> list:
    async def run():
        return await asyncio.gather(*coroutines, return_exceptions=return_exceptions)
    return loop.run_until_complete(run())


async def collect(llm: AsyncLLM, prompt: str, params: SamplingParams, request_id: str):
    ids = llm.tokenizer.encode(prompt)
    return [out async for out in llm.generate({"prompt_token_ids": ids}, params, request_id)]


def test_streams_equal_the_offline_engine(llm, loop, tiny):
    prompts = ["one", "two words", "three short words"]
    outs = gather(loop, *(collect(llm, p, GREEDY, f"eq-{i}") for i, p in enumerate(prompts)))
    offline = LLM(tiny).generate(prompts, GREEDY, use_tqdm=False)
    for stream, expected in zip(outs, offline):
        assert [o.finished for o in stream][-1] and not any(o.finished for o in stream[:-1])
        assert sum((o.outputs[0].token_ids for o in stream), []) == expected.outputs[0].token_ids
        assert "".join(o.outputs[0].text for o in stream) == expected.outputs[0].text


def test_a_failing_request_fails_alone_and_the_core_goes_on(llm, loop):
    poisoned = SamplingParams(max_tokens=8, temperature=1.0, min_p=POISON_MIN_P)
    ok_1, bad, ok_2 = gather(loop, collect(llm, "fine", GREEDY, "ok-1"), collect(llm, "bad", poisoned, "bad"),
                             collect(llm, "also fine", GREEDY, "ok-2"), return_exceptions=True)
    assert isinstance(bad, EngineGenerateError) and "injected" in str(bad) and not bad.invalid
    assert sum(len(o.outputs[0].token_ids) for o in ok_1) == 8 == sum(len(o.outputs[0].token_ids) for o in ok_2)
    (refused,) = gather(loop, collect(llm, "x", SamplingParams(stop_token_ids=[10_000]), "refused"),
                        return_exceptions=True)
    assert isinstance(refused, EngineGenerateError) and refused.invalid and "stop_token_ids" in str(refused)
    assert used_blocks_fraction(llm) == 0.0


def test_leaving_a_stream_early_aborts_the_request_and_frees_its_blocks(llm, loop):
    async def run():
        ids = llm.tokenizer.encode("a long one")
        stream = llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=200, ignore_eos=True), "leave")
        first = await anext(stream)
        await stream.aclose()  # what the server does when the HTTP client disconnects
        assert llm.num_open_streams == 0
        return first, await collect(llm, "after", GREEDY, "after-leave")

    first, after = loop.run_until_complete(run())
    assert not first.finished and after[-1].finished
    assert used_blocks_fraction(llm) == 0.0  # the stats after the last step: the aborted request holds none


def test_reset_prefix_cache_succeeds_when_no_request_holds_blocks(llm, loop):
    assert loop.run_until_complete(llm.reset_prefix_cache()) is True


def test_shutdown_ends_open_streams(tiny, loop):
    llm = AsyncLLM(PoisonedEngineArgs(str(tiny), num_threads=1))

    async def run():
        await llm.start()
        stream = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=500, ignore_eos=True),
                              "long")
        await anext(stream)
        await llm.shutdown()
        with pytest.raises(EngineGenerateError, match="shutting down"):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await anext(llm.generate({"prompt_token_ids": [1]}, GREEDY, "late"))

    loop.run_until_complete(run())
    assert not llm.client.is_alive()
