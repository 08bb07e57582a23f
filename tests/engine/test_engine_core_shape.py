"""The shape vLLM V1 gives the engine, held by the tree: one engine core and one message vocabulary, which the
API server's client and the disaggregation router both use; a scheduler reached only through
`SchedulerInterface`, so no product code reads its queues or its KV cache manager. (Tests may.)"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from core import SCHEDULERS, SCHEDULING_POLICIES, EngineConfig, SchedulerInterface
from ref_engine.async_engine.async_llm import AsyncLLM
from ref_engine.disagg import DisaggregatedLLM
from ref_engine.engine_core import client as client_module
from ref_engine.engine_core import messages
from ref_engine.engine_core.client import AsyncMPClient, EngineDeadError, SyncMPClient
from ref_engine.engine_core.core import EngineCore, EngineCoreArgs, run_engine_core

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("ref_engine", "serving_lab", "sim", "course")


def product_files() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_product_code_reads_the_schedulers_internals():
    pattern = re.compile(r"\bscheduler\.(running|requests|waiting|kv_cache_manager)\b")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in product_files()
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, "use SchedulerInterface's methods (make_stats, explain_prefix, ...):\n" + "\n".join(found)


def interface_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(SchedulerInterface).items()
            if inspect.isfunction(member) and not name.startswith("_")}


@pytest.mark.parametrize("cls", sorted({*SCHEDULERS.values(), *SCHEDULING_POLICIES.values()}, key=lambda c: c.__name__))
def test_every_scheduler_satisfies_the_interface(cls):
    scheduler = cls(EngineConfig(max_model_len=64), 8)
    for name in SchedulerInterface.__annotations__:
        assert hasattr(scheduler, name), f"{cls.__name__} has no {name}"
    for name, signature in interface_methods().items():
        assert list(inspect.signature(getattr(cls, name)).parameters) == list(signature.parameters), \
            f"{cls.__name__}.{name} takes other parameters than SchedulerInterface.{name}"


@pytest.mark.parametrize("path", ["ref_engine/engine.py", "core/step_summary.py"])
def test_the_engine_and_the_live_view_call_only_the_interface(path):
    source = (ROOT / path).read_text(encoding="utf-8")
    called = set(re.findall(r"\bscheduler\.(\w+)", source))
    declared = {*interface_methods(), *SchedulerInterface.__annotations__}
    assert called and called <= declared, f"not in SchedulerInterface: {sorted(called - declared)}"


def test_one_core_and_one_message_vocabulary():
    """Each message class, `EngineCore` and `run_engine_core` are defined once, and two places start
    serving processes: the clients' shared launcher (engine cores) and `MultiprocExecutor` (its workers).
    (Calibration's two measurements of the machine start short-lived processes of their own.)"""
    names = {name for name, value in vars(messages).items()
             if inspect.isclass(value) and value.__module__ == messages.__name__}
    assert {"EngineCoreRequest", "AbortRequests", "UtilityCall", "Shutdown", "EngineCoreReady",
            "EngineCoreStartFailed", "EngineCoreOutputs", "UtilityOutput"} <= names
    wanted = names | {EngineCore.__name__, run_engine_core.__name__}
    defined: dict[str, list[str]] = {}
    starts = []
    for path in product_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in wanted:
                defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Process":
                starts.append(str(path.relative_to(ROOT)))
    assert all(len(paths) == 1 for paths in defined.values()), defined
    assert set(defined) == wanted, f"not found: {wanted - set(defined)}"
    assert sorted(starts) == ["ref_engine/engine_core/client.py", "ref_engine/executor/multiproc_executor.py",
                              "serving_lab/collectives.py", "serving_lab/time_slice.py"], starts


class FakeProcess:
    """Records what a client would start, and is dead from the start."""

    started: list[tuple] = []

    def __init__(self, target, args, name, daemon) -> None:
        FakeProcess.started.append((target, args))
        self.exitcode = 1

    def start(self) -> None:
        pass

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass


def test_the_api_server_and_the_router_start_the_same_engine_core(monkeypatch):
    FakeProcess.started = []
    monkeypatch.setattr(client_module.multiprocessing, "get_context", lambda method: SimpleNamespace(Process=FakeProcess))

    llm = AsyncLLM(EngineCoreArgs("model"))
    assert isinstance(llm.client, AsyncMPClient)
    with pytest.raises(EngineDeadError, match="did not start"):
        asyncio.run(llm.client.start())
    llm.client.close()
    with pytest.raises(EngineDeadError, match="prefill engine process died"):
        DisaggregatedLLM("model")

    assert [target for target, _ in FakeProcess.started] == [run_engine_core] * 3
    roles = [args[0].kv_transfer_config and args[0].kv_transfer_config.kv_role for _, args in FakeProcess.started]
    assert roles == [None, "kv_producer", "kv_consumer"]
    assert issubclass(SyncMPClient, client_module.MPClient) and issubclass(AsyncMPClient, client_module.MPClient)
