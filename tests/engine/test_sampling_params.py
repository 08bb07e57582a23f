"""SamplingParams: vLLM's defaults, normalization of the list fields, and a ValueError naming the field
for every illegal value."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ref_engine.sampling_params import SamplingParams


def test_defaults_follow_vllm():
    params = SamplingParams()
    assert params.max_tokens == 16
    assert params.temperature == 1.0
    assert params.top_k == 0
    assert params.top_p == 1.0
    assert params.min_p == 0.0
    assert params.seed is None
    assert params.stop == []
    assert params.stop_token_ids == []
    assert params.ignore_eos is False
    assert params.min_tokens == 0
    assert params.logprobs is None
    assert params.include_stop_str_in_output is False
    assert not params.is_greedy


def test_stop_string_is_wrapped_and_none_becomes_empty():
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop=None).stop == []
    assert SamplingParams(stop_token_ids=None).stop_token_ids == []
    assert SamplingParams(stop_token_ids=(3, 4)).stop_token_ids == [3, 4]


@pytest.mark.parametrize(
    ("temperature", "greedy"), [(0.0, True), (0, True), (1e-6, True), (1e-5, False), (0.7, False)]
)
def test_is_greedy(temperature, greedy):
    assert SamplingParams(temperature=temperature).is_greedy is greedy


@pytest.mark.parametrize("top_k", [-1, 0, 1, 50])
def test_legal_edge_values_are_accepted(top_k):
    SamplingParams(top_k=top_k, top_p=1.0, min_p=1.0, min_tokens=16, max_tokens=16, logprobs=0, seed=0)
    SamplingParams(top_p=1e-9, min_p=0.0, seed=2**64 - 1)


# (field, bad value, extra kwargs needed to reach the check)
INVALID = [
    ("max_tokens", 0, {}),
    ("max_tokens", -3, {}),
    ("max_tokens", 2.5, {}),
    ("max_tokens", True, {}),
    ("temperature", -0.1, {}),
    ("temperature", math.nan, {}),
    ("temperature", math.inf, {}),
    ("temperature", "hot", {}),
    ("top_k", -2, {}),
    ("top_k", 1.5, {}),
    ("top_p", 0.0, {}),
    ("top_p", 1.01, {}),
    ("top_p", math.nan, {}),
    ("min_p", -0.01, {}),
    ("min_p", 1.5, {}),
    ("seed", -1, {}),
    ("seed", 2**64, {}),
    ("seed", 1.0, {}),
    ("seed", "42", {}),
    ("stop", "", {}),
    ("stop", ["ok", ""], {}),
    ("stop", [7], {}),
    ("stop_token_ids", [-1], {}),
    ("stop_token_ids", [1, 2.0], {}),
    ("stop_token_ids", [True], {}),
    ("ignore_eos", 1, {}),
    ("min_tokens", -1, {}),
    ("min_tokens", 17, {"max_tokens": 16}),
    ("logprobs", -1, {}),
    ("logprobs", 2.0, {}),
    ("include_stop_str_in_output", "yes", {}),
]


@pytest.mark.parametrize(("field", "value", "extra"), INVALID, ids=[f"{f}={v!r}" for f, v, _ in INVALID])
def test_every_validation_error_names_the_field_and_value(field, value, extra):
    with pytest.raises(ValueError) as excinfo:
        SamplingParams(**{field: value, **extra})
    message = str(excinfo.value)
    assert message.startswith(field), message
    assert repr(value) in message, message


def test_replace_validates_again():
    params = SamplingParams(temperature=0.5)
    with pytest.raises(ValueError, match="^top_p"):
        dataclasses.replace(params, top_p=2.0)


def test_validate_for_vocab():
    SamplingParams(stop_token_ids=[0, 99], logprobs=100).validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"^stop_token_ids .*got 100"):
        SamplingParams(stop_token_ids=[5, 100]).validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"^logprobs .*got 101"):
        SamplingParams(logprobs=101).validate_for_vocab(100)
