"""Prefill/decode disaggregation in the real engine: two engine-core processes, a KV connector, a router.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from ref_engine.disagg.llm import DisaggregatedGenerateError, DisaggregatedLLM
from ref_engine.disagg.timings import DisaggTimings

__all__ = ["DisaggTimings", "DisaggregatedGenerateError", "DisaggregatedLLM"]
