"""A step's wall time covers the device's work: on CUDA the runner synchronises before the clock is read."""

from __future__ import annotations

import torch

from ref_engine.runner import synchronize


def test_synchronize_waits_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    synchronize(torch.device("cpu"))
    assert calls == []
    synchronize(torch.device("cuda", 0))
    assert calls == [torch.device("cuda", 0)]
