"""`KVTransferConfig`: how an engine takes part in KV-cache transfer, with vLLM's names and values.

An engine built with one is an instance of a disaggregated deployment: a prefill engine is the
`"kv_producer"` (it runs prompts and saves their K/V through the connector), a decode engine the
`"kv_consumer"` (it admits requests whose prompt K/V it loads through the connector, then decodes).
`kv_connector` names the connector class (ref_engine/kv_transfer/connector.py), and
`kv_connector_module_path` the module that defines it when it is not one of ours (a test's faulty
connector, say). Without a config (the default) the engine never touches a connector.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

KVRole = Literal["kv_producer", "kv_consumer"]


@dataclass(frozen=True)
class KVTransferConfig:
    """vLLM's `KVTransferConfig`, cut to what one producer and one consumer on one machine need."""

    kv_role: KVRole
    kv_connector: str = "SharedMemoryConnector"
    kv_connector_module_path: str | None = None  # where a connector that is not ours is defined
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)  # passed to the connector as is

    def __post_init__(self) -> None:
        if self.kv_role not in ("kv_producer", "kv_consumer"):
            raise ValueError(f"kv_role must be 'kv_producer' or 'kv_consumer', got {self.kv_role!r}")

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role == "kv_producer"

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role == "kv_consumer"
