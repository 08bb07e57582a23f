"""The lifecycle hooks a scheduling policy keeps its state with (`Scheduler.on_added`, `on_admitted`,
`on_computed`, `on_left_running`, `on_released`, `make_request_queue`): every way a request enters, runs,
is preempted, finishes, is aborted or is refused reaches them, once each and in order, torch-free."""

from __future__ import annotations

from core import EngineConfig, Request, RequestStatus, Scheduler, StepResult
from core.request_queue import FCFSRequestQueue, RequestQueue


class RecordingScheduler(Scheduler):
    """The base scheduler, recording each hook call as (hook, request id[, tokens])."""

    def __init__(self, config: EngineConfig, num_kv_blocks: int) -> None:
        self.calls: list[tuple] = []
        super().__init__(config.for_model(512), num_kv_blocks)

    def make_request_queue(self) -> RequestQueue:
        self.calls.append(("make_request_queue",))
        return FCFSRequestQueue()

    def on_added(self, request: Request) -> None:
        self.calls.append(("added", request.request_id))

    def on_admitted(self, request: Request) -> None:
        self.calls.append(("admitted", request.request_id))

    def on_computed(self, request: Request, num_new_tokens: int) -> None:
        self.calls.append(("computed", request.request_id, num_new_tokens))

    def on_left_running(self, request: Request) -> None:
        self.calls.append(("left_running", request.request_id))

    def on_released(self, request: Request) -> None:
        self.calls.append(("released", request.request_id))


def step(sched: Scheduler, now: float, sampled: dict[str, list[int]] | None = None) -> list[Request]:
    """One step in which each row that needs logits samples `sampled[id]` (default: one token 7)."""
    out = sched.schedule(now)
    result = StepResult({s.request_id: (sampled or {}).get(s.request_id, [7]) for s in out.scheduled
                         if s.needs_logits})
    return sched.update_from_output(out, result, now)


def req(request_id: str, prompt_len: int, max_tokens: int) -> Request:
    return Request(request_id, list(range(prompt_len)), max_tokens, ignore_eos=True)


def test_a_request_is_added_admitted_computed_and_released_once():
    sched = RecordingScheduler(EngineConfig(block_size=4, max_num_batched_tokens=4), 16)
    assert sched.calls == [("make_request_queue",)]
    sched.add_request(req("a", 6, 2))
    step(sched, 0.0)  # a prompt chunk of 4: samples nothing, so no `computed`
    step(sched, 1.0)  # the rest of the prompt: the first token
    step(sched, 2.0)  # the second and last
    assert sched.calls[1:] == [("added", "a"), ("admitted", "a"), ("computed", "a", 1), ("computed", "a", 1),
                               ("left_running", "a"), ("released", "a")]


def test_accepted_drafts_are_computed_tokens_and_a_finish_cuts_them():
    config = EngineConfig(speculative_method="ngram", num_speculative_tokens=3,
                          speculative_disable_by_batch_size=None)
    sched = RecordingScheduler(config, 16)
    sched.add_request(req("a", 4, 3))
    step(sched, 0.0)  # prefill: one token
    sched.update_draft_token_ids({"a": [1, 2]})
    step(sched, 1.0, {"a": [1, 2, 3]})  # two drafts accepted and the target's token: 3, cut to the 2 left
    assert [c for c in sched.calls if c[0] == "computed"] == [("computed", "a", 1), ("computed", "a", 2)]


def test_preemption_leaves_running_and_readmits():
    sched = RecordingScheduler(EngineConfig(block_size=4, max_num_batched_tokens=64), 4)
    sched.add_request(req("a", 8, 8))
    sched.add_request(req("b", 7, 8))
    step(sched, 0.0)  # both prefilled: a holds 2 blocks and b 2; b's next token needs a third
    step(sched, 1.0)  # a needs a block first: b, the latest admitted, is preempted
    assert ("left_running", "b") in sched.calls and sched.get_request("b").num_preemptions == 1
    assert [c for c in sched.calls if c[1:2] == ("b",) and c[0] != "computed"] == [
        ("added", "b"), ("admitted", "b"), ("left_running", "b")]


def test_an_abort_releases_from_waiting_or_from_running():
    sched = RecordingScheduler(EngineConfig(max_num_seqs=1), 16)
    sched.add_request(req("a", 4, 8))
    sched.add_request(req("b", 4, 8))
    step(sched, 0.0)
    del sched.calls[:]
    sched.abort_request("b")  # waiting
    sched.abort_request("a")  # running
    assert sched.calls == [("released", "b"), ("left_running", "a"), ("released", "a")]


def test_a_refused_request_reaches_no_hook():
    sched = RecordingScheduler(EngineConfig(block_size=4, max_model_len=64, max_num_seqs=1), 4)
    del sched.calls[:]
    try:
        sched.add_request(req("long", 40, 1))  # needs 10 blocks of a pool of 4
    except ValueError:
        pass
    sched.add_request(req("a", 4, 8))
    assert sched.add_remote_prefilled_request(req("r", 4, 2), 3, now=0.0) is None  # "a" is waiting
    assert sched.calls == [("added", "a")]


def test_a_remote_prefilled_request_is_added_then_admitted_without_queueing():
    sched = RecordingScheduler(EngineConfig(block_size=4, max_model_len=64), 16)
    del sched.calls[:]
    request = req("r", 10, 1)
    assert sched.add_remote_prefilled_request(request, 9, now=0.0) is not None
    step(sched, 1.0)
    assert sched.calls == [("added", "r"), ("admitted", "r"), ("computed", "r", 1), ("left_running", "r"),
                           ("released", "r")]
    assert request.status is RequestStatus.FINISHED_LENGTH
