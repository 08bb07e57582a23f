"""`ParallelConfig`: its knobs checked on construction, and which tensor-parallel degrees split a model."""

from __future__ import annotations

import pytest

from core.arch_config import KNOWN_MODELS, ArchConfig
from core.config import ParallelConfig, tensor_parallel_sizes

TINY = ArchConfig(name="tiny", architecture="llama", num_layers=2, hidden_size=64, num_attention_heads=4,
                  num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=320)


def test_the_backend_follows_the_degree_unless_given():
    assert ParallelConfig().distributed_executor_backend == "uni"
    assert ParallelConfig(tensor_parallel_size=2).distributed_executor_backend == "mp"
    assert ParallelConfig(distributed_executor_backend="mp").distributed_executor_backend == "mp"


@pytest.mark.parametrize(("knobs", "words"), [
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be a positive integer"),
    (dict(tensor_parallel_size=2.0), "tensor_parallel_size must be a positive integer"),
    (dict(distributed_executor_backend="ray"), r"distributed_executor_backend must be one of \('uni', 'mp'\)"),
    (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), "use 'mp'"),
    (dict(allow_cpu_oversubscription="yes"), "allow_cpu_oversubscription must be True or False"),
])
def test_bad_knobs_are_named(knobs, words):
    with pytest.raises(ValueError, match=words):
        ParallelConfig(**knobs)


def test_a_degree_splits_whole_heads_and_copies_kv_heads_past_their_count():
    assert tensor_parallel_sizes(TINY) == [1, 2, 4]  # 4: each of the 2 KV heads on two ranks
    assert tensor_parallel_sizes(KNOWN_MODELS["smollm2-135m"]) == [1, 3]  # 9 does not divide the MLP's 1536
    assert tensor_parallel_sizes(KNOWN_MODELS["llama-3.1-8b"]) == [1, 2, 4, 8, 16, 32]


def test_a_degree_the_model_forbids_names_the_allowed_ones():
    ParallelConfig(tensor_parallel_size=4).verify_with_model(TINY)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 does not split tiny: .* allowed: 1, 2, 4$"):
        ParallelConfig(tensor_parallel_size=3).verify_with_model(TINY)
