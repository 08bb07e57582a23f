"""KV-cache transfer between engines (vLLM's `kv_transfer`): the config and the connectors.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from ref_engine.kv_transfer.config import KVTransferConfig
from ref_engine.kv_transfer.connector import KVConnectorBase, KVTransferParams, make_kv_connector

__all__ = ["KVConnectorBase", "KVTransferConfig", "KVTransferParams", "make_kv_connector"]
