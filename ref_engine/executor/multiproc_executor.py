"""`MultiprocExecutor`: one worker process per tensor-parallel rank (vLLM's name), spawned by the engine.

Each step the engine broadcasts the scheduler's output to every rank and gathers their answers:

* the `SchedulerOutput` is pickled once and written to each worker's pipe: a few KB of token ids and block
  tables (vLLM V1 sends only what changed since the last step, and the workers keep the batch; ours send
  the whole plan each step, which is simpler and small at this scale);
* every rank runs the model on its heads; rank 0 then copies its logits into a buffer in shared memory that
  the engine allocated at start (`[rows, vocab]` float32, as many rows as a step can sample), and the
  engine samples from a view of it. The cost per step is that one copy, rows x vocab x 4 bytes (64 rows of
  SmolLM2: 12.6 MB), with no tensor pickled and no new shared-memory segment; the view is valid until the
  next step;
* each rank answers with a few bytes: done, and the seconds it spent in all-reduce (`all_reduce_s`).

Start: the workers are spawned (a fork would copy torch's thread pools in an unusable state), each sets its
torch threads to max(1, cores // tp) so the ranks do not fight over cores, joins the process group, loads the
model file and keeps its shard, and reports ready (pid, weights, threads); then the executor takes the
smallest of their KV block counts and has them allocate it. A worker that loads other weights than the engine
holds is refused (the cache namespace would lie).

Failure: every wait is bounded and also watches the workers' process sentinels, so a worker that dies makes
the call raise `ExecutorDeadError` at once, and one that hangs makes it raise after `execute_model_timeout_s`;
the executor then ends the other ranks, which may be waiting for the dead one in a collective. `shutdown`
asks each worker to leave, then terminates and kills what is left, and reaps them all. Each worker watches
its parent and exits when the engine's process is gone, however it ended (even SIGKILL).

A daemonic process may not start processes (multiprocessing's rule), so an engine on this executor must run
in a process that is not daemonic; the engine-core process clears its flag for this (engine_core/core.py).

Lesson: lessons/06-architecture-map.md#the-boxes
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing

from core.config import EngineConfig
from core.interfaces import SchedulerOutput
from ref_engine.distributed.parallel_state import worker_threads
from ref_engine.executor.abstract import Executor, ExecutorDeadError
from ref_engine.model.loader import LoadedModel
from ref_engine.runner import ModelOutput
from ref_engine.worker.worker import Worker, WorkerConfig, WorkerInfo, WorkerOutput

logger = logging.getLogger(__name__)

EXECUTE_MODEL_TIMEOUT_S = 300.0  # vLLM's default (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS)
RPC_TIMEOUT_S = 600.0  # start (loading, sharding) and the other calls (allocating, compiling)
SHUTDOWN_GRACE_S = 5.0  # how long workers may take to leave before they are terminated
DEATH_GRACE_S = 1.0  # how long a dying worker may take to be reaped, or a peer's death to show
_SHUTDOWN = b"shutdown"


class MultiprocExecutor(Executor):
    def __init__(self, worker_config: WorkerConfig, model: LoadedModel) -> None:
        """Spawn one worker per rank and wait until each has loaded its shard of `model`'s checkpoint."""
        if multiprocessing.current_process().daemon:
            raise RuntimeError("distributed_executor_backend='mp' starts one process per rank, but this process is "
                               "daemonic and may not have children: run the engine in a non-daemonic process")
        if model.path is None:
            raise ValueError("distributed_executor_backend='mp': each worker loads the model file, and this "
                             "LoadedModel has none (load it with load_model(path), or pass the path)")
        tp = worker_config.parallel_config.tensor_parallel_size
        self.device = worker_config.device
        self.execute_model_timeout_s = EXECUTE_MODEL_TIMEOUT_S
        self.all_reduce_s = [0.0] * tp
        self._dead: str | None = None  # why the executor can no longer run a step
        context = torch.multiprocessing.get_context("spawn")
        rendezvous_dir = tempfile.mkdtemp(prefix="serving-lab-tp-")
        init_method = (Path(rendezvous_dir) / "rendezvous").as_uri()
        self.logits_buffer = torch.empty(max_num_logit_rows(worker_config.config), model.arch.vocab_size,
                                         dtype=torch.float32).share_memory_()
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.conns: list[Connection] = []
        self._finalizer = weakref.finalize(self, _stop_workers, self.processes, self.conns, rendezvous_dir)
        try:
            for rank in range(tp):
                conn, child_conn = context.Pipe()
                process = context.Process(
                    target=worker_main, name=f"Worker-{rank}", daemon=True,
                    args=(rank, worker_config, init_method, child_conn, self.logits_buffer if rank == 0 else None))
                process.start()
                child_conn.close()
                self.processes.append(process)
                self.conns.append(conn)
            infos: list[WorkerInfo] = self._gather("start", RPC_TIMEOUT_S)
            for info in infos:
                if (info.model_id, info.weights_digest) != (model.model_id, model.weights_digest):
                    raise ValueError(f"worker {info.rank} loaded {info.model_id} (weights {info.weights_digest}) from "
                                     f"{model.path}, but the engine holds {model.model_id} (weights "
                                     f"{model.weights_digest}): pass the path, or a model as load_model(path, "
                                     "dtype, quantization=...) gives it")
                logger.info("worker %d (pid %d): %d threads, %.1f MiB of weights", info.rank, info.pid,
                            info.num_threads, info.weight_bytes / 2**20)
        except BaseException:
            self.shutdown()
            raise

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def collective_rpc(self, method: str, args: tuple[Any, ...] = (), timeout: float = RPC_TIMEOUT_S) -> list[Any]:
        """`Worker.<method>(*args)` in every worker process, their results in rank order. A worker's
        exception is raised here (with its traceback as a note), and like a death or a timeout it ends the
        executor: the ranks may no longer agree on where they are."""
        if self._dead is not None:
            raise ExecutorDeadError(self._dead)
        message = pickle.dumps((method, args))
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(message)
            except OSError:
                self._fail(f"{method}: {self._death(rank)}")
        return self._gather(method, timeout)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        try:
            outputs: list[WorkerOutput] = self.collective_rpc("execute_model", (scheduler_output,),
                                                              self.execute_model_timeout_s)
        except ExecutorDeadError:
            raise
        except Exception as error:
            raise ExecutorDeadError(f"a worker failed in execute_model: {type(error).__name__}: {error}") from error
        self.all_reduce_s = [o.all_reduce_s for o in outputs]
        logits = self.logits_buffer[:scheduler_output.num_logit_rows].to(self.device)
        return replace(outputs[0].model_output, logits=logits)

    def shutdown(self) -> None:
        self._finalizer()

    def _gather(self, what: str, timeout: float) -> list[Any]:
        """Every worker's answer to the call just sent (`what` names it), waiting at most `timeout` seconds
        and never for a worker that died."""
        results: dict[int, Any] = {}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        deadline = time.monotonic() + timeout
        while len(results) < len(self.conns):
            waiting = {conn: rank for rank, conn in enumerate(self.conns) if rank not in results}
            ready = wait([*waiting, *sentinels], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self._fail(f"{what}: no answer from worker(s) {sorted(waiting.values())} within {timeout:g} s")
            dead = [sentinels[obj] for obj in ready if obj in sentinels]
            if dead:
                self._fail(f"{what}: {self._death(dead[0])}")
            for conn in ready:
                rank = waiting[conn]
                try:
                    status, result, worker_traceback = conn.recv()
                except (EOFError, OSError):
                    self._fail(f"{what}: {self._death(rank)}")
                if status == "error":
                    # a rank whose collective broke because a peer died reports that first: name the death
                    died = wait(list(sentinels), timeout=DEATH_GRACE_S)
                    if died:
                        self._fail(f"{what}: {self._death(sentinels[died[0]])}")
                    result.add_note(f"in worker {rank}:\n{worker_traceback}")
                    self._fail(f"{what}: worker {rank} raised {type(result).__name__}: {result}", result)
                results[rank] = result
        return [results[rank] for rank in range(len(self.conns))]

    def _fail(self, reason: str, error: Exception | None = None) -> None:
        """End every worker and raise: the worker's `error` if it raised one, else `ExecutorDeadError`."""
        self._dead = f"the executor is dead: {reason}"
        for process in self.processes:
            if process.is_alive():
                process.kill()  # a rank may wait in a collective for the dead one, or be hung itself
        self.shutdown()
        raise error if error is not None else ExecutorDeadError(self._dead)

    def _death(self, rank: int) -> str:
        """How worker `rank` ended. Its sentinel fires as the process exits, a moment before it can be reaped."""
        process = self.processes[rank]
        process.join(DEATH_GRACE_S)
        code = process.exitcode
        how = "still running" if code is None else f"signal {-code}" if code < 0 else f"exit code {code}"
        return f"worker {rank} (pid {process.pid}) died ({how})"


def max_num_logit_rows(config: EngineConfig) -> int:
    """The most rows of logits one step samples or verifies: one per request, 1 + k with k drafts, and never
    more than the step's tokens."""
    drafts = config.num_speculative_tokens if config.speculative_method else 0
    return min(config.max_num_batched_tokens, config.max_num_seqs * (1 + drafts))


def _stop_workers(processes: list[multiprocessing.process.BaseProcess], conns: list[Connection],
                  rendezvous_dir: str) -> None:
    """Ask the workers to leave, terminate then kill what stays, reap them all, and clean up."""
    for conn in conns:
        try:
            conn.send_bytes(_SHUTDOWN)
        except OSError:
            pass  # that worker is gone already
    deadline = time.monotonic() + SHUTDOWN_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join()
    for conn in conns:
        conn.close()
    shutil.rmtree(rendezvous_dir, ignore_errors=True)


# ---- in the worker process ----

def worker_main(rank: int, worker_config: WorkerConfig, distributed_init_method: str, conn: Connection,
                logits_buffer: torch.Tensor | None) -> None:
    """A worker process: build the worker, report ready, then answer the executor's calls until it says
    shutdown or its end of the pipe closes. Ctrl-C is the engine's to handle, not the worker's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    torch.set_num_threads(worker_threads(worker_config.parallel_config.tensor_parallel_size))
    worker = Worker(rank, worker_config, distributed_init_method)

    def start() -> WorkerInfo:
        worker.init_device()
        return worker.load_model()

    try:
        _answer(conn, start)
        while True:
            try:
                message = conn.recv_bytes()
            except EOFError:
                return
            if message == _SHUTDOWN:
                return
            method, args = pickle.loads(message)
            _answer(conn, _call, worker, method, args, logits_buffer)
    finally:
        worker.shutdown()


def _call(worker: Worker, method: str, args: tuple[Any, ...], logits_buffer: torch.Tensor | None) -> Any:
    """`worker.<method>(*args)`; logits (rank 0's) go into the shared buffer instead of the answer."""
    result = getattr(worker, method)(*args)
    if isinstance(result, WorkerOutput) and result.model_output.logits is not None:
        logits = result.model_output.logits
        if len(logits) > len(logits_buffer):
            raise ValueError(f"{len(logits)} rows of logits do not fit the shared buffer's {len(logits_buffer)}")
        logits_buffer[:len(logits)].copy_(logits)
        result.model_output = replace(result.model_output, logits=None)
    return result


def _answer(conn: Connection, call: Callable[..., Any], *args: Any) -> None:
    """Send ("ok", result, None), or ("error", exception, traceback) if `call(*args)` raises."""
    try:
        result = call(*args)
    except Exception as error:
        trace = traceback.format_exc()
        try:
            conn.send(("error", error, trace))
        except Exception:  # an exception that does not pickle: its text does
            conn.send(("error", RuntimeError(f"{type(error).__name__}: {error}"), trace))
        return
    conn.send(("ok", result, None))


def _exit_with_parent() -> None:
    """Exit as soon as the parent (the engine's process) is gone, however it ended: a thread waits on its
    sentinel, which multiprocessing gives every spawned child."""
    parent = multiprocessing.parent_process()

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="watch-engine", daemon=True).start()
