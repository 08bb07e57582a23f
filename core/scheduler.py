"""The scheduler: which requests run this step, and how many tokens each.

One rule covers everything: each request has `num_computed_tokens`, and a step gives each scheduled request
N >= 1 new tokens under one token budget (`max_num_batched_tokens`). A whole prompt, a prefill chunk and a
decode token differ only in N.

`Scheduler` is **continuous batching** (Orca's iteration-level scheduling, as in vLLM). `schedule` runs
two phases that fill one `StepPlan`:
1. `schedule_running`: running requests first, in admission order: each gets its remaining tokens (1 when
   decoding, the rest of its prompt when prefilling), cut to the budget left (chunked prefill) and to the
   prefill budgets (`long_prefill_token_threshold` per request, `prefill_budget_tokens` per step); decode
   rows share `decode_batch_max_tokens` tokens (1 + k each with k drafts; the last one's drafts are cut to
   fit), and a decode row with no token left, or a prefill row once the prefill budget is spent, sits the
   step out;
2. if a running request needs a KV block and none is free, a victim is preempted (`select_victim`: the
   most recently admitted running request): by recompute (free its blocks, requeue it at the head,
   recompute prompt + output later) or by swap (copy its blocks to the host pool; recompute when the host
   pool is full);
3. `schedule_waiting`, only if nothing was preempted: waiting requests are admitted in the waiting queue's
   order (`request_queue_class`: first come, first served) while budget, `max_num_seqs`,
   `max_num_partial_prefills`, the prefill budgets and free blocks last; the first that does not fit stops
   admission. A request whose tenant already runs `tenant_max_num_seqs` is passed over for this step, and
   keeps its place in the queue. A request joins the batch the step after another
   leaves: no bubbles. With prefix caching, an admitted request starts with its cached leading blocks
   already computed, so only the rest of its prompt counts against the budget;
4. after the step (`update_from_output`), every block a request completed is registered in the prefix
   cache.

A scheduling policy is a subclass that overrides some of these parts (the queue's order, the victim, how
a phase spends the budget) and registers under a name with `@register_scheduler`
(core/scheduler_registry.py); `EngineConfig(scheduling=name)` then selects it, in the engine
and in the simulator alike. The scheduling policies of continuous batching ("fcfs", which is this class,
"priority", "fair") are such subclasses too, selected by `EngineConfig(scheduling_policy=name)`.
`StaticScheduler`, the baseline lesson 1 contrasts, is one: it forms a batch, reserves each member's whole
prompt + max_tokens up front, and admits nobody until every member has finished.

A policy that keeps state of its own (counters, an order of the running list) follows a request's life
through hooks, which do nothing here and which the base calls as it moves the request: `on_added`
(accepted, just before it is queued), `on_admitted` (waiting -> running), `on_computed` (a step appended
output tokens), `on_left_running` (preempted, or finished while running) and `on_released` (finished or
aborted: gone). Its waiting queue comes from `make_request_queue`. So a policy never overrides `schedule`
or the methods callers use (`add_request`, `update_from_output`, `finish_request`, ...), and every way in
or out of the scheduler reaches its hooks.

Speculative decoding (lesson 5) is the same rule with a longer N: a decoding request that carries
`spec_token_ids` (set by `update_draft_token_ids`, vLLM's name, after the step's update) gets its next
token plus those drafts (1 + k tokens, counted in the budget and in `allocate_slots`), and
`update_from_output` moves `num_computed_tokens` back over the drafts the verifier rejected. Their slots
stay allocated and are overwritten by later tokens. `requests_to_speculate` says who may get drafts (and
how many), so the engine's proposers and the simulator's follow one rule.

Everything is plain Python with no clock and no tensors: callers pass `now`, so the real engine (wall
clock) and the simulator (SimPy clock) drive the very same objects, through the methods of
`SchedulerInterface` (core/interfaces.py) and nothing else: no caller reads the queues or the KV cache
manager. `make_stats` reports the queues, the pool and the preemptions (running totals, kept here as
requests are preempted and resume).

Lesson: lessons/01-continuous-batching.md; preemption in lessons/02-paged-attention.md; cache lookups in
lessons/04-prefix-caching.md; speculation in lessons/05-speculative-decoding.md; prefill budgets in
lessons/03-chunked-prefill-and-disaggregation.md#budget-knobs.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.config import EngineConfig
from core.interfaces import ScheduledRequest, SchedulerOutput, SchedulerStats, StepResult
from core.kv_cache_manager import KVCacheManager, PrefixCacheExplanation
from core.kv_pool_snapshot import KVPoolSnapshot
from core.request import Request, RequestStatus
from core.request_queue import FCFSRequestQueue, RequestQueue
from core.scheduler_registry import SCHEDULERS, SCHEDULING_POLICIES, register_scheduler

# The status the per-request loop of `update_from_output` tests, as a plain global: on Python 3.11, reading
# a member off the enum class (RequestStatus.RUNNING) goes through EnumType's attribute hook, ~10x slower.
_RUNNING = RequestStatus.RUNNING


@dataclass
class StepPlan:
    """One step's decisions so far: the phases of `Scheduler.schedule` add to it, in batch order. A prefill
    row computes more than its request's last known token; a decode row computes just that (and drafts)."""

    token_budget: int  # tokens this step may still schedule
    prefill_token_budget: int  # prefill tokens it may still schedule (`prefill_budget_tokens`)
    decode_token_budget: int  # decode tokens (1 + drafts per row) it may still schedule (`decode_batch_max_tokens`)
    partial_prefill_budget: int  # prefill rows it may still schedule (`max_num_partial_prefills`)
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, its new tokens)
    preempted: list[str] = field(default_factory=list)  # request ids, in the order they were preempted
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, host block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host block, device block)


@register_scheduler("continuous")
@register_scheduler("fcfs", policy=True)
class Scheduler:
    """Continuous batching with chunked prefill and preemption."""

    request_queue_class: type[RequestQueue] = FCFSRequestQueue  # the waiting queue's order

    def __init__(self, config: EngineConfig, num_kv_blocks: int, *, cache_namespace: str = "",
                 explain_misses: bool = False) -> None:
        """`cache_namespace` (the model's id) and `explain_misses` go to the KV cache manager."""
        if config.max_model_len is None:
            raise ValueError("max_model_len is unset: call config.for_model(...) before building a scheduler")
        self.config = config
        # A budget that is off is the bound the step has anyway, so the phases need no None checks.
        budget = config.max_num_batched_tokens
        self.long_prefill_token_threshold = config.long_prefill_token_threshold or budget
        self.prefill_budget_tokens = config.prefill_budget_tokens or budget
        self.decode_batch_max_tokens = config.decode_batch_max_tokens or budget
        self.max_num_partial_prefills = config.max_num_partial_prefills or config.max_num_seqs
        # the host pool: settled from swap_space by kv_sizing.with_swap_pool (unset: none, recompute instead)
        num_swap = (config.num_swap_blocks or 0) if config.preemption_mode == "swap" else 0
        self.num_swap_blocks = num_swap  # the host pool's size, for the executor's swap space
        self.kv_cache_manager = KVCacheManager(
            config.block_size, num_kv_blocks, num_swap_blocks=num_swap,
            allocation=config.kv_allocation, max_model_len=config.max_model_len,
            enable_caching=config.enable_prefix_caching, cache_namespace=cache_namespace,
            explain_misses=explain_misses)
        self.waiting: RequestQueue = self.make_request_queue()
        self.running: list[Request] = []  # in admission order
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.tenant_max_num_seqs = dict(config.tenant_max_num_seqs or ())
        self.num_running_by_tenant: Counter[str] = Counter()  # by `Request.tenant_key`; no zero entries
        self.num_preemptions = 0  # preemption events
        self.num_preempted_reqs = 0  # requests preempted at least once
        self.num_waiting_preempted_reqs = 0  # of those, the ones waiting (or swapped out) to resume
        self.num_steps = 0

    # ---- requests in and out ----

    def add_request(self, request: Request) -> None:
        """Queue a request, or refuse it with a ValueError if it could never run on this engine.

        `max_tokens` is cut so that prompt + output fit `max_model_len`, as vLLM does.
        """
        self._check_request(request)
        self.requests[request.request_id] = request
        self.on_added(request)
        self.waiting.add_request(request)

    def _check_request(self, request: Request) -> None:
        """Refuse (ValueError) a request that could never run here; else cap its `max_tokens` and hash its
        prompt. Changes nothing else, so a refused request leaves no trace."""
        cfg = self.config
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        if request.num_prompt_tokens >= cfg.max_model_len:
            raise ValueError(
                f"prompt of request {request.request_id!r} has {request.num_prompt_tokens} tokens; "
                f"max_model_len is {cfg.max_model_len}, so it must be at most {cfg.max_model_len - 1}")
        request.max_tokens = min(request.max_tokens, cfg.max_model_len - request.num_prompt_tokens)
        needed = self.kv_cache_manager.max_blocks_needed(request)
        pool = self.kv_cache_manager.block_pool.num_blocks
        if needed > pool:
            raise ValueError(
                f"request {request.request_id!r} needs {needed} KV blocks at its longest "
                f"({request.max_total_tokens} tokens, kv_allocation={cfg.kv_allocation!r}) but the pool "
                f"has {pool}; raise num_kv_blocks / kv_cache_memory or lower max_tokens")
        if cfg.enable_prefix_caching:
            self.kv_cache_manager.block_hashes(request)  # the prompt's hash chain, once, before any step

    def add_remote_prefilled_request(self, request: Request, num_external_tokens: int,
                                     now: float) -> list[int] | None:
        """Admit, straight to running, a request whose first `num_external_tokens` tokens were prefilled by
        another engine: their K/V arrives through a KV connector (disaggregated prefill, lesson 3), so they
        count as computed, and the next step runs only the rest (the last prompt token, whose logits sample
        the first output token). Returns the request's block table, for the caller to fill with the received
        K/V before that step; or None, changing nothing, while it cannot run yet (requests are waiting,
        `max_num_seqs` run, or too few blocks are free): try again after a step. Holding blocks only once
        running means no waiting request ever sits on blocks the running ones need. A request that could
        never run raises ValueError, as in `add_request`."""
        self._check_request(request)
        if not (0 <= num_external_tokens < request.num_prompt_tokens):
            raise ValueError(f"request {request.request_id!r}: {num_external_tokens} external tokens for a "
                             f"prompt of {request.num_prompt_tokens} (at most all but the last)")
        # len(), not truth: a fair queue is falsy while all its backlogged tenants are at their caps, and
        # a remote request must not overtake them
        can_admit = (len(self.waiting) == 0 and len(self.running) < self.config.max_num_seqs
                     and not self.at_tenant_cap(request))
        if not can_admit or self.kv_cache_manager.allocate_slots(request, request.num_prompt_tokens) is None:
            return None
        self.requests[request.request_id] = request
        self.on_added(request)
        request.num_computed_tokens = num_external_tokens
        self.admit(request, now)
        return self.kv_cache_manager.get_block_ids(request.request_id)

    def reset_prefix_cache(self, tenant: str | None = None) -> int:
        """Take the prefix cache, or `tenant`'s part of it, out of use now (vLLM's name), even while requests
        run: see `KVCacheManager.reset_prefix_cache`. Returns how many blocks left the cache."""
        return self.kv_cache_manager.reset_prefix_cache(tenant)

    def get_request(self, request_id: str) -> Request | None:
        """The unfinished request with this id, or None."""
        return self.requests.get(request_id)

    def abort_request(self, request_id: str, now: float = 0.0) -> Request | None:
        """Stop a request wherever it is; returns it, or None if it is unknown or already finished."""
        request = self.finish_request(request_id, RequestStatus.FINISHED_ABORTED, now)
        if request is not None:
            self.kv_cache_manager.take_explanation(request_id)  # nobody will ask for it
        return request

    def finish_request(self, request_id: str, status: RequestStatus, now: float, *,
                       num_output_tokens: int | None = None) -> Request | None:
        """End a request from outside the step loop (an abort, or a stop string the engine detected).

        `num_output_tokens` keeps only that many output tokens: a stop string can end amid the several
        tokens a verify step appended. The request's counts follow the cut (token times, computed tokens,
        hashed blocks). It happens only as the request finishes: blocks already registered in the prefix
        cache may hold the dropped tokens (their K/V is right for them, so the cache stays valid), and a
        request going on would write other tokens into them.
        """
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request in self.running:
            self.leave_running(request)
        else:
            self.waiting.remove_request(request)
            if request.num_preemptions:
                self.num_waiting_preempted_reqs -= 1
        if num_output_tokens is not None:
            del request.output_token_ids[num_output_tokens:], request.token_times[num_output_tokens:]
            request.first_token_time = request.token_times[0] if request.token_times else None
            request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
            del request.block_hashes[request.num_tokens // self.config.block_size:]
        request.status = status
        self._release(request, now)
        return request

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting or running (what a least-loaded router compares)."""
        return len(self.requests)

    def unfinished_request_ids(self) -> list[str]:
        return list(self.requests)

    def running_request_ids(self) -> list[str]:
        """The running requests' ids, in admission order."""
        return [request.request_id for request in self.running]

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def make_stats(self) -> SchedulerStats:
        """Queues, pool and preemption totals now."""
        pool = self.kv_cache_manager.block_pool
        return SchedulerStats(len(self.running), len(self.waiting), pool.num_blocks, pool.num_free_blocks,
                              self.num_preemptions, self.num_preempted_reqs, self.num_waiting_preempted_reqs,
                              len(self.kv_cache_manager.host_block_tables))

    def snapshot_kv_pool(self) -> KVPoolSnapshot:
        """The KV pool block by block, each used block with its tenant, for a live view (`KVPoolSnapshot`)."""
        return KVPoolSnapshot.of(self.kv_cache_manager, self.requests)

    def explain_prefix(self, request: Request) -> PrefixCacheExplanation:
        """How far the prefix cache would serve `request`'s prompt right now, and why the next block would
        miss; changes nothing (`KVCacheManager.explain_prefix`)."""
        return self.kv_cache_manager.explain_prefix(request)

    def take_prefix_cache_explanation(self, request_id: str) -> PrefixCacheExplanation | None:
        """Why the request's prompt hit the prefix cache as far as it did, as of its (last) admission; None
        unless the scheduler was built with `explain_misses` and caching on. Given once, then forgotten."""
        return self.kv_cache_manager.take_explanation(request_id)

    # ---- one step ----

    def schedule(self, now: float) -> SchedulerOutput:
        """Spend this step's token budget: `schedule_running`, then `schedule_waiting` unless a request was
        preempted (memory is short, so a newcomer would only push someone out again)."""
        proposed = {r.request_id: len(r.spec_token_ids) for r in self.running if r.spec_token_ids}
        plan = StepPlan(self.config.max_num_batched_tokens, self.prefill_budget_tokens,
                        self.decode_batch_max_tokens, self.max_num_partial_prefills)
        self.schedule_running(plan)
        if not plan.preempted:
            self.schedule_waiting(plan, now)
        return self._make_output(plan, proposed)

    def schedule_running(self, plan: StepPlan) -> None:
        """Give each running request, in admission order, its remaining tokens (plus its drafts when it
        decodes) cut to the budgets left; when its KV blocks cannot grow, preempt `select_victim`'s choice
        among the requests not yet scheduled, until they can or the request itself was the victim. A row
        the decode or prefill budget has no room for sits the step out (and keeps its blocks)."""
        kv = self.kv_cache_manager
        # Read directly, as `_make_output` does: a row whose block table already has room for its tokens (a
        # decode row in all but one step in block_size) needs no `allocate_slots` call, the same check first.
        block_tables, block_size = kv.block_tables, kv.block_size
        running = self.running
        scheduled = plan.scheduled
        budget, prefill_budget = plan.token_budget, plan.prefill_token_budget
        decode_tokens, prefill_rows = plan.decode_token_budget, plan.partial_prefill_budget
        threshold = self.long_prefill_token_threshold
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            remaining = request.num_tokens - request.num_computed_tokens
            if remaining == 1:  # a decode row: the last known token, and the drafts after it
                n = 1 + len(request.spec_token_ids)
                if n > decode_tokens:  # not min(): on Python 3.11 that builtin costs more than this branch
                    n = decode_tokens
                if n > budget:
                    n = budget
            else:
                n = min(remaining, threshold, prefill_budget, budget)
            if not n:
                i += 1
                continue
            table = block_tables.get(request.request_id)
            if (table is None or len(table) * block_size < request.num_computed_tokens + n) and \
                    not self.allocate_or_preempt(request, n, i, plan):
                continue  # it was the victim itself: running[i] is now the next request
            scheduled.append((request, n))
            budget -= n
            if remaining == 1:
                decode_tokens -= n
            else:
                prefill_budget -= n
                prefill_rows -= 1
            i += 1
        plan.token_budget, plan.prefill_token_budget = budget, prefill_budget
        plan.decode_token_budget, plan.partial_prefill_budget = decode_tokens, prefill_rows

    def allocate_or_preempt(self, request: Request, num_new_tokens: int, i: int, plan: StepPlan) -> bool:
        """Give running[i] its slots, preempting `select_victim`'s choice among running[i:] (the requests not yet
        scheduled) while the pool is short; False if the request itself was preempted."""
        while self.kv_cache_manager.allocate_slots(request, num_new_tokens) is None:
            victim = self.select_victim(self.running[i:])
            self.preempt(victim, plan)
            if victim is request:
                return False
        return True

    def schedule_waiting(self, plan: StepPlan, now: float) -> None:
        """Admit waiting requests in the queue's order while budget, `max_num_seqs`, the prefill budgets and
        free blocks last. Each gets its remaining tokens after its cached prefix, or (chunked prefill) what
        the budgets have left; the first that does not fit stops admission, so the queue's order is never
        overtaken. Requests of tenants at their `tenant_max_num_seqs` are set aside for the step and put back
        where they were."""
        kv = self.kv_cache_manager
        waiting = self.waiting
        max_num_seqs = self.config.max_num_seqs
        budget = plan.token_budget
        passed_over: list[Request] = []  # in the order popped
        while waiting and budget > 0 and len(self.running) < max_num_seqs:
            request = waiting.peek_request()
            if self.tenant_max_num_seqs and self.at_tenant_cap(request):
                passed_over.append(waiting.pop_request())
                continue
            prefix = kv.get_computed_blocks(request)
            remaining = request.num_tokens - request.num_computed_tokens - prefix.num_tokens
            if remaining == 1:  # a decode row (a swapped-out decode, or a prompt cached but for its last token)
                n = min(1, plan.decode_token_budget, budget)
            elif plan.partial_prefill_budget:
                n = min(remaining, self.long_prefill_token_threshold, plan.prefill_token_budget, budget)
            else:
                n = 0
            if not n or (n < remaining and not self.config.enable_chunked_prefill):
                break
            if request.status is RequestStatus.SWAPPED:
                swap_in = kv.swap_in(request, n)
                if swap_in is None:
                    break
                plan.swap_in += swap_in
            elif kv.allocate_slots(request, n, prefix) is None:
                break
            self.admit(waiting.pop_request(), now, prefix.num_tokens)
            plan.scheduled.append((request, n))
            budget -= n
            if remaining == 1:
                plan.decode_token_budget -= n
            else:
                plan.prefill_token_budget -= n
                plan.partial_prefill_budget -= 1
        plan.token_budget = budget
        for request in reversed(passed_over):
            waiting.prepend_request(request)

    def at_tenant_cap(self, request: Request) -> bool:
        """Whether the request's tenant already runs its `tenant_max_num_seqs` requests."""
        tenant = request.tenant_key
        return self.num_running_by_tenant[tenant] >= self.tenant_max_num_seqs.get(tenant, sys.maxsize)

    def select_victim(self, candidates: Sequence[Request]) -> Request:
        """The request to preempt when KV blocks run out. `candidates` are the running requests not yet
        scheduled this step, in the running list's order (the first is the one that needs the block); the
        default is the last, the most recently admitted, which has the least work to lose."""
        return candidates[-1]

    def admit(self, request: Request, now: float, num_cached_tokens: int = 0) -> None:
        """Move a request, already popped from the waiting queue and given its KV blocks, to running; its
        first `num_cached_tokens` uncomputed tokens came from the prefix cache."""
        request.num_computed_tokens += num_cached_tokens
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_cached_tokens
        if request.num_preemptions:
            self.num_waiting_preempted_reqs -= 1
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self.num_running_by_tenant[request.tenant_key] += 1
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
        self.on_admitted(request)

    def preempt(self, request: Request, plan: StepPlan) -> None:
        """Take a running request off the device and put it back at the head of the waiting queue: swapped
        to the host pool if `preemption_mode="swap"` and the host pool has room, else to be recomputed."""
        self.leave_running(request)
        if not request.num_preemptions:
            self.num_preempted_reqs += 1
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.num_waiting_preempted_reqs += 1
        plan.preempted.append(request.request_id)
        self.waiting.prepend_request(request)
        if self.config.preemption_mode == "swap":
            swap_out = self.kv_cache_manager.swap_out(request.request_id)
            if swap_out is not None:
                request.status = RequestStatus.SWAPPED
                plan.swap_out += swap_out
                return
        self.kv_cache_manager.free(request.request_id)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.spec_token_ids = []

    def update_from_output(self, output: SchedulerOutput, result: StepResult, now: float) -> list[Request]:
        """Advance every scheduled request by its tokens, append sampled tokens, retire finished ones."""
        finished = []
        requests, sampled = self.requests, result.sampled_token_ids
        kv = self.kv_cache_manager
        caching, block_size = kv.enable_caching, self.config.block_size
        # the base's hook does nothing: call it per row only where a policy overrides it
        on_computed = self.on_computed if type(self).on_computed is not Scheduler.on_computed else None
        for scheduled in output.scheduled:
            request = requests.get(scheduled.request_id)
            if request is None or request.status is not _RUNNING:
                continue  # finished or aborted while the step ran
            computed_before = request.num_computed_tokens
            num_computed = computed_before + len(scheduled.token_ids)
            if request.spec_token_ids:
                request.spec_token_ids = []  # this step used them; the proposer drafts afresh for the next
            is_done = False
            if scheduled.needs_logits:
                token_ids = sampled[scheduled.request_id]
                # Roll back over the rejected drafts: only the accepted ones' K/V follows the right tokens.
                num_computed -= scheduled.num_draft_tokens + 1 - len(token_ids)
                num_new = 0
                for token_id in token_ids:
                    num_new += 1
                    if request.append_output_token(token_id, now):
                        is_done = True
                        break
                if on_computed is not None:
                    on_computed(request, num_new)
            request.num_computed_tokens = num_computed
            if caching and num_computed // block_size > computed_before // block_size:
                kv.cache_full_blocks(request)  # this step completed a block: register it for later requests
            if is_done:
                self.leave_running(request)
                self._release(request, now)
                finished.append(request)
        self.num_steps += 1
        return finished

    def requests_to_speculate(self) -> list[tuple[Request, int]]:
        """Running requests that may carry draft tokens into the next step, each with its most drafts.

        A request qualifies once it decodes (one known token left to compute). It may take up to
        `num_speculative_tokens` drafts, fewer near `max_tokens` (all accepted plus the target's own token
        must still fit). Nobody qualifies while more than `speculative_disable_by_batch_size` requests run:
        a batch that big already keeps the device busy, and verifying drafts would cost more than it saves.
        """
        cfg = self.config
        limit = cfg.speculative_disable_by_batch_size
        if cfg.speculative_method is None or (limit is not None and len(self.running) > limit):
            return []
        candidates = []
        for request in self.running:
            most = min(cfg.num_speculative_tokens, request.max_tokens - request.num_output_tokens - 1)
            if request.num_tokens - request.num_computed_tokens == 1 and most > 0:
                candidates.append((request, most))
        return candidates

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        """Give requests the draft tokens a proposer made for the next step (vLLM's name), after
        `update_from_output`; ids of requests that finished meanwhile are skipped."""
        requests = self.requests
        for request_id, token_ids in draft_token_ids.items():
            request = requests.get(request_id)
            if request is not None:
                request.spec_token_ids = token_ids

    # ---- a policy's hooks: each does nothing here ----

    def make_request_queue(self) -> RequestQueue:
        """The waiting queue, built once in `__init__`: `request_queue_class()`. A policy whose queue reads
        the policy's own state overrides this (that state must exist before `Scheduler.__init__` runs)."""
        return self.request_queue_class()

    def on_added(self, request: Request) -> None:
        """`request` was accepted and is unfinished from now on. Called before it is queued (or, a remote
        prefill, admitted), so the queue may read what this hook records; a refused request never gets here."""

    def on_admitted(self, request: Request) -> None:
        """`request` moved from waiting to running (appended to `running`) with its KV blocks."""

    def on_computed(self, request: Request, num_new_tokens: int) -> None:
        """A step appended `num_new_tokens` output tokens to `request` (its sampled token and the drafts the
        verifier accepted; fewer if it finished on one). Prefill chunks that sample nothing are not reported."""

    def on_left_running(self, request: Request) -> None:
        """`request` left the running list: preempted (back to waiting), or finished or aborted while running
        (then `on_released` follows)."""

    def on_released(self, request: Request) -> None:
        """`request` is gone: finished or aborted, its blocks freed."""

    # ---- helpers ----

    def leave_running(self, request: Request) -> None:
        """Take a request off the running list (preempted or finished), and out of its tenant's count."""
        self.running.remove(request)
        counts, tenant = self.num_running_by_tenant, request.tenant_key
        counts[tenant] -= 1
        if not counts[tenant]:
            del counts[tenant]  # tenants come and go: keep only those running
        self.on_left_running(request)

    def _release(self, request: Request, now: float) -> None:
        self.kv_cache_manager.free(request.request_id)
        del self.requests[request.request_id]
        request.finish_time = now
        self.on_released(request)

    def _make_output(self, plan: StepPlan, proposed: dict[str, int]) -> SchedulerOutput:
        kv = self.kv_cache_manager
        block_tables = kv.block_tables  # read directly: `get_block_ids` would add a call per request
        scheduled = []
        num_scheduled_tokens = 0
        for request, n in plan.scheduled:
            start = request.num_computed_tokens
            num_known = request.num_tokens - start  # known tokens not computed yet
            if n < num_known:  # a prefill chunk that stops short of the last known token: no logits
                token_ids, num_drafts = request.token_ids(start, start + n), 0
            else:  # the rest of the known tokens, then `num_drafts` draft tokens
                token_ids, num_drafts = request.token_ids(start, start + num_known), n - num_known
                if num_drafts:
                    token_ids += request.spec_token_ids[:num_drafts]
            # positional: a call with keywords costs more, and this runs once per request per step
            scheduled.append(ScheduledRequest(request.request_id, token_ids, start,
                                              block_tables[request.request_id], n >= num_known, num_drafts))
            num_scheduled_tokens += n
        live = sum([r.num_computed_tokens for r in self.running]) + num_scheduled_tokens
        return SchedulerOutput(
            step_id=self.num_steps, scheduled=scheduled, preempted_request_ids=plan.preempted,
            swap_out=plan.swap_out, swap_in=plan.swap_in, copy_blocks=kv.take_copies(), kv_usage=kv.usage,
            num_live_tokens=live, num_reserved_slots=kv.num_reserved_slots, num_proposed_tokens=proposed)


@register_scheduler("static")
class StaticScheduler(Scheduler):
    """Static batching: a batch runs until its last member finishes; nobody joins in between.

    Each member reserves prompt + max_tokens slots when the batch forms, so a static batch never preempts
    (and, like the servers before vLLM, holds memory its requests may never use).
    """

    def schedule_running(self, plan: StepPlan) -> None:
        """Each member its remaining tokens under the budget, in order; without chunked prefill, a member
        whose prompt does not fit what is left waits for the next step. Never preempts: the slots are
        reserved."""
        budget = plan.token_budget
        for request in self.running:
            remaining = request.num_tokens - request.num_computed_tokens
            n = min(remaining, budget)
            if n == 0 or (n < remaining and not self.config.enable_chunked_prefill):
                continue
            self.kv_cache_manager.allocate_slots(request, n)  # within the reservation: takes no new block
            plan.scheduled.append((request, n))
            budget -= n
        plan.token_budget = budget

    def schedule_waiting(self, plan: StepPlan, now: float) -> None:
        """Once the last batch has finished, form the next: up to `max_num_seqs` requests in the queue's
        order, each reserving prompt + max_tokens slots, whose first tokens then run in this very step."""
        if self.running:
            return
        kv = self.kv_cache_manager
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek_request()
            prefix = kv.get_computed_blocks(request)
            reserve = request.max_total_tokens - request.num_computed_tokens - prefix.num_tokens
            if kv.allocate_slots(request, reserve, prefix) is None:
                break
            self.admit(self.waiting.pop_request(), now, prefix.num_tokens)
        self.schedule_running(plan)


def make_scheduler(config: EngineConfig, num_kv_blocks: int, *, cache_namespace: str = "",
                   explain_misses: bool = False) -> Scheduler:
    """The scheduler `config.scheduling` names, or for continuous batching the one `config.scheduling_policy`
    names (both registered with `register_scheduler`)."""
    if config.scheduling == "continuous":
        cls = SCHEDULING_POLICIES[config.scheduling_policy]
    else:
        cls = SCHEDULERS[config.scheduling]
    return cls(config, num_kv_blocks, cache_namespace=cache_namespace, explain_misses=explain_misses)
