"""A KV connector with injected failures, for tests/engine/test_disagg.py. It lives in a module of its own
because the engine processes import it by name (`kv_connector_module_path="disagg_faults"`).

`kv_connector_extra_config`: {"fail_save": [request ids], "fail_load": [request ids]}.
"""

from __future__ import annotations

import torch

from ref_engine.kv_transfer.connector import KVTransferParams
from ref_engine.kv_transfer.shared_memory_connector import SharedMemoryConnector


class FaultyConnector(SharedMemoryConnector):
    def save_kv(self, request_id: str, kv_caches: list[torch.Tensor], block_ids: list[int]) -> str:
        if request_id in self.config.kv_connector_extra_config.get("fail_save", ()):
            raise OSError("injected: the link to the decode engine is down")
        return super().save_kv(request_id, kv_caches, block_ids)

    def load(self, params: KVTransferParams, kv_caches: list[torch.Tensor], block_ids: list[int]) -> None:
        if params.request_id in self.config.kv_connector_extra_config.get("fail_load", ()):
            raise OSError("injected: the K/V arrived corrupted")
        super().load(params, kv_caches, block_ids)
