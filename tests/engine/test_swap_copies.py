"""Swapping beside a CUDA device: the host pool is pinned and the copy plan runs on a side stream, its swaps
asynchronous, with the compute stream waiting for them; on a CPU nothing of this (ref_engine/runner.py). CUDA
is faked: its stream calls are recorded, the tensors stay on the CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch

from core.interfaces import SchedulerOutput
from ref_engine import runner as runner_module
from ref_engine.model.loader import load_model
from ref_engine.runner import ModelRunner

NUM_BLOCKS, BLOCK_SIZE = 6, 4
pytestmark = pytest.mark.cpu_only(reason="CUDA's streams are faked around tensors on the CPU")


@pytest.fixture(scope="module")
def loaded(make_tiny_hf_model):
    return load_model(make_tiny_hf_model("llama", name="swap-copies"), device="cpu")


class FakeStream:
    """A CUDA stream that records what it is asked to wait for."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")


def fake_cuda(monkeypatch, log: list) -> list[bool]:
    """CUDA's stream calls recorded in `log`; every KV pool allocated on the CPU. Returns each allocation's
    `pin_memory`."""
    pinned = []
    allocate = runner_module.allocate_kv_cache

    def allocate_on_cpu(*args, pin_memory=False, **kw):
        pinned.append(pin_memory)
        return allocate(*args[:4], torch.device("cpu"), *args[5:], **kw)

    @contextlib.contextmanager
    def on_stream(stream):
        log.append(f"enter {stream.name}")
        yield
        log.append(f"leave {stream.name}")

    compute = FakeStream("compute", log)
    monkeypatch.setattr(runner_module, "allocate_kv_cache", allocate_on_cpu)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream("copy", log))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    return pinned


def make_runner(loaded, device: str) -> ModelRunner:
    return ModelRunner(loaded.model, loaded.arch, num_kv_blocks=NUM_BLOCKS, num_swap_blocks=NUM_BLOCKS,
                       block_size=BLOCK_SIZE, dtype=torch.float32, device=torch.device(device))


def fill(runner: ModelRunner) -> None:
    for layer in (*runner.kv_caches, *runner.host_kv_caches):
        layer.copy_(torch.randn_like(layer))


PLAN = SchedulerOutput(step_id=0, scheduled=[], swap_out=[(1, 4), (3, 0)], copy_blocks=[(2, 5)],
                       swap_in=[(2, 1)])


def expected_after(runner: ModelRunner) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Both pools after `PLAN`, copied by hand in the plan's order."""
    device, host = [t.clone() for t in runner.kv_caches], [t.clone() for t in runner.host_kv_caches]
    for d, h in zip(device, host):
        h[:, 4], h[:, 0] = d[:, 1], d[:, 3]
        d[:, 5] = d[:, 2]
        d[:, 1] = h[:, 2]
    return device, host


def test_on_cuda_the_host_pool_is_pinned_and_swaps_run_on_a_side_stream(loaded, monkeypatch):
    log: list[str] = []
    pinned = fake_cuda(monkeypatch, log)
    runner = make_runner(loaded, "cuda")
    assert pinned == [False, True]  # the device's pool, then the host's
    fill(runner)
    device, host = expected_after(runner)
    copies, copy = [], torch.Tensor.copy_

    def recorded_copy(self, src, non_blocking=False):
        copies.append((non_blocking, log[-1]))  # asynchronous? on which stream?
        return copy(self, src, non_blocking=non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", recorded_copy)
    runner.run_copy_plan(PLAN)
    assert log == ["copy waits for compute", "enter copy", "leave copy", "compute waits for copy"]
    # each swapped block's K and V, in every layer, straight into the other pool, asynchronously
    num_swapped = len(PLAN.swap_out) + len(PLAN.swap_in)
    assert copies == [(True, "enter copy")] * (2 * num_swapped * loaded.arch.num_layers)
    for got, want in zip((*runner.kv_caches, *runner.host_kv_caches), (*device, *host)):
        assert torch.equal(got, want)


def test_on_a_cpu_the_plan_is_copied_in_place_with_no_stream_and_no_pinning(loaded, monkeypatch):
    log: list[str] = []
    pinned = fake_cuda(monkeypatch, log)
    runner = make_runner(loaded, "cpu")
    assert pinned == [False, False] and runner.copy_stream is None
    fill(runner)
    device, host = expected_after(runner)
    runner.run_copy_plan(PLAN)
    assert log == []
    for got, want in zip((*runner.kv_caches, *runner.host_kv_caches), (*device, *host)):
        assert torch.equal(got, want)
