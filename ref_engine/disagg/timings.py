"""`DisaggTimings`: where one disaggregated request's time went, prefill -> KV transfer -> decode.

The three stages follow each other, so they add up to the request's end-to-end latency:
- `prefill_s`: from the router sending the request to the prefill engine until its prompt's K/V was
  computed (queueing there included);
- `transfer_s`: saving the K/V through the connector, the hop through the router to the decode engine's
  pipe, and loading it into the decode engine's blocks; `transfer_bytes` is what moved;
- `decode_s`: the rest: waiting for the decode engine to read the request (it reads between steps) and to
  have room for it, the step that recomputes the last prompt token and samples the first output token,
  then decoding. (The simulator's `Cluster` charges those waits to the decode replica too.)
`ttft_s` (router to first token) and `itl_s` (gaps between output tokens) are what the simulator's
`Cluster` is compared on. Every time is a `time.perf_counter()` difference: one clock for every process on
this machine.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DisaggTimings:
    prefill_s: float
    transfer_s: float
    transfer_bytes: int
    decode_s: float
    ttft_s: float
    itl_s: tuple[float, ...]

    @property
    def e2e_s(self) -> float:
        return self.prefill_s + self.transfer_s + self.decode_s
