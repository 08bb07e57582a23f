"""Where the two engines of a disaggregated pair run: each role's device, and two roles on one GPU only
within its memory (`place_pair`, ref_engine/disagg/llm.py); a rank on the engine's own GPU. No process is
started and no GPU is needed: CUDA's presence is faked and the router's clients record what they were given."""

from __future__ import annotations

import pytest
import torch

from core import EngineConfig
from ref_engine.disagg import DisaggregatedLLM
from ref_engine.disagg import llm as llm_module
from ref_engine.disagg.llm import place_pair
from ref_engine.distributed.parallel_state import rank_device

HALF = EngineConfig(gpu_memory_utilization=0.45)


@pytest.fixture
def on_a_gpu_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_a_pair_on_one_gpu_must_split_it(on_a_gpu_machine):
    with pytest.raises(ValueError, match=r"share cuda:0.*0\.9 \+ 0\.9 > 1.*gpu_memory_utilization.*prefill_device"):
        place_pair(None, None, EngineConfig(), EngineConfig())
    with pytest.raises(ValueError, match="share cuda:0"):  # "cuda" is the first GPU
        place_pair("cuda", "cuda:0", HALF, EngineConfig())
    assert place_pair(None, None, HALF, HALF) == ("cuda:0", "cuda:0")
    assert place_pair("cuda", None, HALF, EngineConfig(gpu_memory_utilization=0.55)) == ("cuda:0", "cuda:0")


def test_a_pair_on_two_gpus_or_on_the_cpu_takes_any_shares(on_a_gpu_machine):
    assert place_pair("cuda:0", "cuda:1", EngineConfig(), EngineConfig()) == ("cuda:0", "cuda:1")
    assert place_pair("cpu", "cpu", EngineConfig(), EngineConfig()) == ("cpu", "cpu")


def test_without_a_gpu_both_roles_default_to_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert place_pair(None, None, EngineConfig(), EngineConfig()) == ("cpu", "cpu")


class RecordingClient:
    """Stands in for an engine-core client: keeps the arguments its engine would be built from."""

    def __init__(self, engine_args, name) -> None:
        self.engine_args, self.name = engine_args, name

    def wait_ready(self, timeout_s: float) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("kwargs", "devices"), [
    (dict(prefill_device="cuda:0", decode_device="cuda:1"), ("cuda:0", "cuda:1")),
    (dict(device="cuda:1", decode_device="cuda:0"), ("cuda:1", "cuda:0")),
    (dict(device="cuda"), ("cuda:0", "cuda:0")),
])
def test_each_roles_engine_gets_its_device(on_a_gpu_machine, monkeypatch, kwargs, devices):
    monkeypatch.setattr(llm_module, "SyncMPClient", RecordingClient)
    with DisaggregatedLLM("model", HALF, HALF, **kwargs) as llm:
        assert (llm.prefill.engine_args.device, llm.decode.engine_args.device) == devices
        assert llm.decode.engine_args.kv_transfer_config.kv_role == "kv_consumer"


def test_a_pair_too_big_for_its_gpu_is_refused_before_any_engine_starts(on_a_gpu_machine, monkeypatch):
    started = []
    monkeypatch.setattr(llm_module, "SyncMPClient", lambda *args: started.append(args))
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        DisaggregatedLLM("model", EngineConfig(), HALF.replace(gpu_memory_utilization=0.2), device="cuda")
    assert started == []


def test_rank_0_runs_on_the_engines_own_gpu():
    assert rank_device(torch.device("cuda", 1), 0) == torch.device("cuda", 1)
    assert rank_device(torch.device("cuda"), 1) == torch.device("cuda", 1)
    assert rank_device(torch.device("cpu"), 3) == torch.device("cpu")
