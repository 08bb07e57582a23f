"""`StepSummary`: one step as a live view draws it, and `StepSummarizer`, which makes one per step.

A `StepRecord` is what calibration needs (every row's query and context length); a live view needs less
and more: the batch split into decode rows and prefill chunks against the step's token budget, the queues
after the step (running, waiting, swapped), preemptions, KV usage, and now and then a picture of the KV
pool (`KVPoolSnapshot`). The engine core and the simulator both make these from the same scheduler, so the
dashboard draws a served run and a simulated one alike.

A decode row is a row of one new token (plus the drafts it verifies), as the scheduler budgets it; every
other row is a prefill chunk. The summarizer reads the scheduler's state after the step: O(1) per step
but for the rows' split (O(batch)). The pool snapshot is the expensive part, so it is taken at most every
`pool_interval` of the caller's clock (stretched for a large pool so that at most
`MAX_BLOCKS_VISITED_PER_S` blocks are visited a second), and on the last step before the engine idles, so
a view of an idle engine shows its final pool rather than one from mid-burst.

Lesson: lessons/06-architecture-map.md (what an operator sees of the loop).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.kv_pool_snapshot import KVPoolSnapshot
from core.metrics import StepRecord
from core.scheduler import Scheduler

POOL_INTERVAL_S = 0.1  # a pool snapshot at most this often: a view redraws about 10 times a second
MAX_BLOCKS_VISITED_PER_S = 40_960  # 4096 blocks 10 times a second; a larger pool is snapshotted less often


@dataclass(frozen=True)
class StepSummary:
    step_id: int
    start: float  # on the run's clock (the engine's, or simulated), seconds
    duration: float
    token_budget: int  # max_num_batched_tokens
    max_num_seqs: int
    num_decode_rows: int
    num_decode_tokens: int  # one per decode row, plus the drafts it verifies
    num_prefill_rows: int
    num_prefill_tokens: int
    num_running: int  # after the step
    num_waiting: int  # after the step, swapped-out requests included (as vllm:num_requests_waiting)
    num_swapped: int
    num_preempted: int  # preemptions in this step
    kv_usage: float  # after the step (as vllm:kv_cache_usage_perc)
    kv_pool: KVPoolSnapshot | None = None  # taken now and then (`StepSummarizer`)


class StepSummarizer:
    """Summarizes each step of one scheduler, right after it (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, pool_interval: float = POOL_INTERVAL_S) -> None:
        """`pool_interval`: the least time between two pool snapshots, on the clock `summarize` is given."""
        if pool_interval < 0:
            raise ValueError(f"pool_interval must be >= 0, got {pool_interval}")
        self.scheduler = scheduler
        num_blocks = scheduler.kv_cache_manager.block_pool.num_blocks
        self.pool_interval = max(pool_interval, num_blocks / MAX_BLOCKS_VISITED_PER_S)
        self._last_pool_time: float | None = None

    def summarize(self, record: StepRecord, now: float) -> StepSummary:
        """The summary of the step `record` describes, which the scheduler has just finished; `now` is
        the clock that spaces the pool snapshots."""
        scheduler = self.scheduler
        drafts = {request_id: num_drafts for request_id, num_drafts, _ in record.verified}
        num_decode_rows = num_decode_tokens = num_prefill_tokens = 0
        for request_id, query_len in zip(record.request_ids, record.query_lens):
            if query_len - drafts.get(request_id, 0) == 1:
                num_decode_rows += 1
                num_decode_tokens += query_len
            else:
                num_prefill_tokens += query_len
        kv = scheduler.kv_cache_manager
        pool = None
        idle = not scheduler.has_unfinished_requests()
        if idle or self._last_pool_time is None or now - self._last_pool_time >= self.pool_interval:
            pool = KVPoolSnapshot.of(kv, scheduler.requests)
            self._last_pool_time = now
        return StepSummary(
            step_id=record.step_id, start=record.start, duration=record.duration,
            token_budget=scheduler.config.max_num_batched_tokens, max_num_seqs=scheduler.config.max_num_seqs,
            num_decode_rows=num_decode_rows, num_decode_tokens=num_decode_tokens,
            num_prefill_rows=record.num_seqs - num_decode_rows, num_prefill_tokens=num_prefill_tokens,
            num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
            num_swapped=len(kv.host_block_tables), num_preempted=record.num_preempted,
            kv_usage=kv.usage, kv_pool=pool)
