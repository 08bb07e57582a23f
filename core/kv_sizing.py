"""KV pool sizing: how many KV blocks one device holds, one rule for the engine and the simulator.

vLLM sizes its pool after a profiling run: of the device's memory, the `gpu_memory_utilization` share may be
used; the weights and the activation peak of the largest step come off it, and what is left is cut into
KV blocks:

    num_kv_blocks = floor((device_memory * gpu_memory_utilization - weight_bytes - activation_bytes)
                          / bytes_per_block)

The engine measures the device memory and the loaded weights with torch; the simulator reads them from a
hardware profile and the model's dims. The simulator estimates the activation peak with
`ArchConfig.peak_activation_bytes`; the engine on a GPU measures it as vLLM does, in a dummy step at the
largest batch (ref_engine/worker/), so on a GPU the two pools differ by that estimate's error alone. A CPU
has no device memory to profile (the pool would share RAM with everything else), so there the pool is a
fixed `CPU_KV_CACHE_MEMORY` on both sides. `EngineConfig.num_kv_blocks`, then
`EngineConfig.kv_cache_memory`, override the rule.

A draft model (`speculative_method="draft_model"`) keeps a pool of its own whose block ids are the target's,
one for one, so a block id costs the target's bytes and the draft's: with its `DraftFootprint` the rule cuts
the memory into blocks of both, and the draft's own weights come off the budget beside the target's.

Lesson: lessons/02-paged-attention.md (the pool is what the weights leave).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from core.config import EngineConfig

CPU_KV_CACHE_MEMORY = 1 << 30  # bytes of KV pool on a CPU when no size is configured
MAX_SWAP_SHARE = 0.7  # the largest share of the host's memory that swap_space may take


@dataclass(frozen=True)
class DraftFootprint:
    """What a draft model adds on the device that runs it, for the pool's sizing."""

    bytes_per_block: int  # one block of the draft's KV cache (its layers, its heads, its dtype)
    weight_bytes: float = 0  # its own weights; 0 for speculative_model="self:L", which reuses the target's


def num_kv_blocks(config: EngineConfig, bytes_per_block: int, *, device_memory: float | None = None,
                  weight_bytes: float = 0, activation_bytes: float = 0, model: str = "the model",
                  draft: DraftFootprint | None = None) -> int:
    """The KV pool of one device, in blocks; the first rule that applies:

    1. `config.num_kv_blocks`;
    2. `config.kv_cache_memory` bytes, in whole blocks;
    3. no `device_memory` (a CPU): `CPU_KV_CACHE_MEMORY` bytes, in whole blocks;
    4. what `config.gpu_memory_utilization` of `device_memory` leaves after `weight_bytes` and
       `activation_bytes` (all per device), in whole blocks.

    With a `draft`, every block holds the target's `bytes_per_block` and the draft's, and the draft's weights
    count beside `weight_bytes`. ValueError when not one block fits; `model` names the model in the message.
    """
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if draft is not None:
        bytes_per_block += draft.bytes_per_block
        weight_bytes += draft.weight_bytes
        model = f"{model} and its draft"
    memory = config.kv_cache_memory
    if memory is None and device_memory is None:
        memory = CPU_KV_CACHE_MEMORY
    if memory is not None:
        if memory < bytes_per_block:
            raise ValueError(f"kv_cache_memory={memory} bytes holds not one KV block of {model} "
                             f"({bytes_per_block} bytes)")
        return memory // bytes_per_block
    budget = device_memory * config.gpu_memory_utilization
    if weight_bytes >= budget:
        raise ValueError(
            f"{model} needs {weight_bytes / 1e9:.1f} GB of weights per device, but "
            f"gpu_memory_utilization={config.gpu_memory_utilization} of {device_memory / 1e9:.1f} GB offers "
            f"{budget / 1e9:.1f} GB; shard it over more devices, use a smaller dtype or a bigger device")
    free = budget - weight_bytes - activation_bytes
    if free < bytes_per_block:
        raise ValueError(
            f"after {weight_bytes / 1e9:.1f} GB of weights and {activation_bytes / 1e9:.2f} GB of "
            f"activations, {max(free, 0) / 1e9:.2f} GB are left: not one KV block of {model} "
            f"({bytes_per_block} bytes) fits")
    return int(free // bytes_per_block)


def with_swap_pool(config: EngineConfig, bytes_per_block: int, *, host_memory: int | None = None) -> EngineConfig:
    """`config` with its host pool settled in `num_swap_blocks` when `preemption_mode="swap"` (unchanged
    otherwise): `num_swap_blocks` if set, else `swap_space` GiB in whole blocks. With `host_memory` (bytes;
    the engine measures it, the simulator has none), a pool over `MAX_SWAP_SHARE` of it is a ValueError."""
    if config.preemption_mode != "swap":
        return config
    swap_bytes = (config.swap_space * 2**30 if config.num_swap_blocks is None
                  else config.num_swap_blocks * bytes_per_block)
    if host_memory is not None and swap_bytes > MAX_SWAP_SHARE * host_memory:
        raise ValueError(f"a host swap pool of {swap_bytes / 2**30:.1f} GiB is more than {MAX_SWAP_SHARE:.0%} of "
                         f"this host's {host_memory / 2**30:.1f} GiB; lower swap_space (or num_swap_blocks)")
    if config.num_swap_blocks is not None:
        return config
    return replace(config, num_swap_blocks=int(swap_bytes // bytes_per_block))
