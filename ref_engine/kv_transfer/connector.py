"""The KV connector: how a prefill engine's K/V reaches a decode engine, in vLLM's vocabulary.

The producer (prefill engine) calls `save` in the step that computes a prompt, while the prompt's blocks
are still its own: the connector copies their K/V somewhere the consumer can reach and returns
`KVTransferParams` (vLLM's `kv_transfer_params`), the small description that travels with the request's
output to the router and on to the decode engine. The consumer calls `load` with them once it has given
the request blocks of its own, and the connector writes the K/V into those blocks. `discard` frees saved
K/V that will never be loaded (the consumer refused the request or died).

A concrete connector implements the three moves on one request's blocks (`save_kv`, `load_kv`,
`discard_kv`); `save` and `load` add the bookkeeping every connector shares: timing, byte counts, and
turning a failed save into an error that fails only that request. `make_kv_connector` builds the class a
`KVTransferConfig` names, as vLLM's connector factory does.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from __future__ import annotations

import importlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import torch

from ref_engine.kv_transfer.config import KVTransferConfig

# Our connectors, by name -> module that defines a class of that name (imported when first asked for).
KV_CONNECTORS = {"SharedMemoryConnector": "ref_engine.kv_transfer.shared_memory_connector"}


@dataclass(frozen=True)
class KVTransferParams:
    """One request's saved K/V, as the producer describes it to the consumer (vLLM's `kv_transfer_params`).

    Times are `time.perf_counter()` readings: one monotonic clock for every process on this machine, so the
    consumer can tell how long the K/V was in transit."""

    request_id: str
    num_tokens: int  # prompt tokens whose K/V was saved: all but the last, which the consumer recomputes
    num_blocks: int  # blocks that hold them
    num_bytes: int  # K and V of those blocks in every layer
    handle: str | None  # where the connector put them (None when there was nothing to save, or it failed)
    saved_at: float  # when saving began: the prompt's K/V had just been computed
    save_s: float = 0.0
    error: str | None = None  # why saving failed; the consumer must not admit the request then
    cache_namespace: str = ""  # the producer's (model, weights, dtypes, tokenizer): the consumer's must match


class KVConnectorBase(ABC):
    """Moves the K/V of a request's leading blocks from a producer's paged cache to a consumer's."""

    def __init__(self, config: KVTransferConfig) -> None:
        self.config = config

    # ---- what each connector implements ----

    @abstractmethod
    def save_kv(self, request_id: str, kv_caches: list[torch.Tensor], block_ids: list[int]) -> str:
        """Copy these blocks of every layer out of the cache; returns the handle `load_kv` reads them by."""

    @abstractmethod
    def load_kv(self, handle: str, kv_caches: list[torch.Tensor], block_ids: list[int]) -> None:
        """Write the saved blocks into these blocks of every layer, and free the saved copy."""

    @abstractmethod
    def discard_kv(self, handle: str) -> None:
        """Free a saved copy that will never be loaded (a no-op if it is already gone)."""

    # ---- what every connector shares ----

    def save(self, request_id: str, kv_caches: list[torch.Tensor], block_ids: list[int],
             num_tokens: int) -> KVTransferParams:
        """Producer: save the K/V of the first `num_tokens` tokens, held in `block_ids`. Never raises: a
        failure is reported in the params' `error`, so that one request fails and the step goes on."""
        start = time.perf_counter()
        num_bytes = len(block_ids) * sum(layer.nbytes // layer.shape[1] for layer in kv_caches)
        params = KVTransferParams(request_id, num_tokens, len(block_ids), num_bytes, None, saved_at=start)
        if not block_ids:  # a one-token prompt: the consumer computes it all
            return params
        try:
            handle = self.save_kv(request_id, kv_caches, block_ids)
        except Exception as error:  # the connector's failure is this request's, not the engine's
            return replace(params, num_bytes=0, error=f"saving its KV failed: {type(error).__name__}: {error}")
        return replace(params, handle=handle, save_s=time.perf_counter() - start)

    def load(self, params: KVTransferParams, kv_caches: list[torch.Tensor], block_ids: list[int]) -> None:
        """Consumer: write the saved K/V into the request's first `params.num_blocks` blocks."""
        if params.handle is not None:
            self.load_kv(params.handle, kv_caches, block_ids[:params.num_blocks])

    def discard(self, params: KVTransferParams) -> None:
        if params.handle is not None:
            self.discard_kv(params.handle)


def make_kv_connector(config: KVTransferConfig) -> KVConnectorBase:
    """The connector `config.kv_connector` names: one of ours, or a class in `kv_connector_module_path`."""
    module_path = config.kv_connector_module_path or KV_CONNECTORS.get(config.kv_connector)
    if module_path is None:
        raise ValueError(f"unknown kv_connector {config.kv_connector!r}; ours are {sorted(KV_CONNECTORS)}, "
                         "or give kv_connector_module_path")
    connector_class = getattr(importlib.import_module(module_path), config.kv_connector, None)
    if not (isinstance(connector_class, type) and issubclass(connector_class, KVConnectorBase)):
        raise ValueError(f"{module_path} has no KV connector class named {config.kv_connector!r}")
    return connector_class(config)
