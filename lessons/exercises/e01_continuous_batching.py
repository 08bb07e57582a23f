"""Exercises of lesson 1, "From static to continuous batching": E01.1 and E01.2.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e01_continuous_batching.py --impl=learner          # both exercises
    pytest tests/exercises/test_e01_continuous_batching.py --impl=learner -k e01_1 # one

The tests compare your answers with the engine's own schedulers (ref_engine/core/scheduler.py), run on
the same inputs. Reference solutions: lessons/exercises/solutions/e01_continuous_batching.py.

Lesson: lessons/01-continuous-batching.md#exercises
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToyRequest:
    """A request reduced to the three numbers a scheduler reads (given: nothing to write here).

    `num_computed_tokens` counts the tokens whose K/V is already in the cache; the request still needs
    `num_tokens - num_computed_tokens` tokens run through the model before it can sample its next token.
    """

    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int = 0  # tokens generated so far
    num_computed_tokens: int = 0  # tokens whose K/V is cached

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt plus generated."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_remaining(self) -> int:
        """Tokens to run before the next sample: 1 when decoding, more when (re)filling the prompt."""
        return self.num_tokens - self.num_computed_tokens


def schedule_step(running: list[ToyRequest], waiting: list[ToyRequest], max_num_batched_tokens: int,
                  max_num_seqs: int, enable_chunked_prefill: bool = True) -> dict[str, int]:
    """E01.1 (implement): one step of continuous batching.

    `running` holds the requests already in the batch, in the order they were admitted; `waiting` the
    queue, oldest first (requests there have `num_computed_tokens == 0`). KV memory is plentiful here: no
    request is ever preempted (lesson 2 adds that). Return `{request_id: tokens scheduled this step}`, in
    the order you scheduled them, leaving out requests that get nothing. The rules are the engine's
    (`Scheduler.schedule` in ref_engine/core/scheduler.py):

    1. Running requests first, in order. Each gets all its remaining tokens (`num_remaining`: 1 when
       decoding, the rest of its prompt if its prefill was cut last step), but never more than the token
       budget left (`max_num_batched_tokens` minus what earlier requests took). Stop when the budget is 0.
    2. Then waiting requests, in order, while budget is left and fewer than `max_num_seqs` requests are
       running (every running request counts, even one that got no tokens in step 1; each admitted request
       counts from then on). A waiting request gets its remaining tokens. If they exceed the budget left:
       with `enable_chunked_prefill` it gets what is left (a chunk; the rest comes next step); without it,
       admission stops right there: the queue is first come, first served, so nobody behind it may jump
       ahead, even a request that would fit.

    Example: running = [a (decoding), b (decoding)], waiting = [c (10-token prompt)], budget 8,
    max_num_seqs 4: a and b take 1 token each, c gets a 6-token chunk -> {"a": 1, "b": 1, "c": 6}.
    Without chunked prefill c does not fit the 6 tokens left, so the step is {"a": 1, "b": 1}.

    Interview question: Q-SCHED-01 (lessons/interview-bank.md#q-sched-01).
    """
    raise NotImplementedError("E01.1: schedule one continuous-batching step")


def static_steps(output_lens: list[int], batch_size: int) -> int:
    """E01.2 (predict-then-run), part a: how many steps static batching takes.

    Every request has a 1-token prompt, so the step that runs its prompt also samples its first output
    token, and request i then needs `output_lens[i]` steps in all. Every step costs the same whatever the
    batch holds (decode steps nearly do, below the knee: lesson 1, "The cost of a step").

    Static batching takes the requests in list order, `batch_size` at a time, and runs each batch until its
    longest member finishes; only then does the next batch start.
    Example: output_lens = [4, 1, 1, 2], batch_size 2 -> batches [4, 1] and [1, 2] -> 4 + 2 = 6 steps.
    """
    raise NotImplementedError("E01.2: count the steps of static batching")


def continuous_steps(output_lens: list[int], batch_size: int) -> int:
    """E01.2 (predict-then-run), part b: how many steps continuous batching takes.

    Same requests and costs as `static_steps`. At most `batch_size` requests run in a step; when one
    finishes, the next request in list order takes its place in the very next step.
    Example: [4, 1, 1, 2] with batch_size 2: step 1 runs (r0, r1); step 2 (r0, r2); steps 3-4 (r0, r3)
    -> 4 steps, against 6 for static batching.

    Hint: no schedule beats max(ceil(sum(output_lens) / batch_size), max(output_lens)) steps; the exact
    count follows each of the `batch_size` slots (a heap of "free at step t" works).
    """
    raise NotImplementedError("E01.2: count the steps of continuous batching")


def throughput_ratio(output_lens: list[int], batch_size: int) -> float:
    """E01.2 (predict-then-run), part c: continuous over static throughput (output tokens per step).

    Both produce the same tokens, so the ratio is static steps / continuous steps.
    Predict before you compute: with batch_size 8, what is the ratio when all outputs are 128 tokens? When
    one request of each batch wants 1536 tokens and the others 16? Then run the notebook's experiment
    (outputs exponential with mean 128, capped at 32 / 128 / 512 / 1536) and compare.

    Interview questions: Q-BATCH-01, Q-BATCH-02 (lessons/interview-bank.md#q-batch-01).
    """
    raise NotImplementedError("E01.2: the continuous / static throughput ratio")
