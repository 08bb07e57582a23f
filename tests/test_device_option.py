"""The suite's `--device` option (tests/conftest.py): `--device cuda` without a GPU is a usage error said once,
and under `--device cuda` a test marked `cpu_only` skips with its reason (a GPU faked by a plugin here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_ONLY_TESTS = "tests/engine/test_engine_kv_pool.py"  # every test of it is marked cpu_only


def pytest_run(args: list[str], plugin_dir: Path | None = None) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(ROOT), str(plugin_dir or ""), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": path})


def test_device_cuda_without_a_gpu_is_a_usage_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --device cuda runs for real")
    done = pytest_run([CPU_ONLY_TESTS, "--device", "cuda"])
    assert done.returncode == 4  # pytest's usage error
    assert "--device cuda, but this torch" in done.stderr and "sees no CUDA device" in done.stderr


def test_a_cpu_only_test_skips_under_device_cuda_saying_why(tmp_path):
    (tmp_path / "fake_gpu.py").write_text("import torch\ntorch.cuda.is_available = lambda: True\n")
    done = pytest_run([CPU_ONLY_TESTS, "--device", "cuda", "-p", "fake_gpu"], plugin_dir=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    assert " passed" not in done.stdout and "skipped" in done.stdout
    assert "CPU only: a CPU engine: its fixed pool" in done.stdout
