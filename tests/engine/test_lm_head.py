"""The screened LM head of the quantized paths (ref_engine/model/lm_head.py): its error bound holds on
SmolLM2's real head, its argmax is the float32 head's, and a row's logits do not depend on its batch."""

from __future__ import annotations

import pytest
import torch

from ref_engine.model.int4 import has_int4_kernel
from ref_engine.model.lm_head import ScreenedLMHead
from serving_lab.eval_set import chat_token_ids, eval_prompts, greedy_continuations, sequence_hidden_states

pytestmark = pytest.mark.skipif(not has_int4_kernel(torch.device("cpu")), reason="needs torch's CPU int8/int4 kernels")


@pytest.fixture(scope="module")
def eval_hidden(smollm2):
    """The final hidden states along float32's greedy continuations of 4 eval prompts, 16 tokens each: the
    rows the head sees when the engine decodes them."""
    prompts = chat_token_ids(smollm2, eval_prompts(4))
    continuations = greedy_continuations(smollm2, prompts, 16)
    return torch.cat([sequence_hidden_states(smollm2, p + c)[len(p) - 1:] for p, c in zip(prompts, continuations)])


@torch.inference_mode()
def test_the_bound_holds_and_the_argmax_is_float32_s_on_smollm2(smollm2, eval_hidden):
    weight = smollm2.model.lm_head.weight
    head = ScreenedLMHead(weight)
    exact = eval_hidden @ weight.T
    approximate, bound = head.approximate(eval_hidden)
    assert bool(((exact - approximate).abs() <= bound).all())  # the module docstring's inequality, entry by entry
    assert bool((approximate.argmax(dim=1) != exact.argmax(dim=1)).any()), "int8 alone flips no near-tie here"
    screened = head(eval_hidden)
    assert torch.equal(screened.argmax(dim=1), exact.argmax(dim=1))
    # candidates carry float32 values: equal to the full product up to float32 summation order
    top = exact.argmax(dim=1, keepdim=True)
    assert torch.allclose(screened.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_near_ties_go_to_the_float32_winner():
    """A random head with planted near-ties (rows that differ by far less than an int8 step): the screen
    returns the float32 argmax every time, where the int8 logits alone miss some."""
    generator = torch.Generator().manual_seed(0)
    vocab, hidden = 512, 64
    weight = torch.randn(vocab, hidden, generator=generator) * 0.05
    weight[1::2] = weight[0::2] + 1e-5 * torch.randn(vocab // 2, hidden, generator=generator)  # pairs of twins
    x = torch.randn(200, hidden, generator=generator) * 3
    x[:, 0] *= 40  # an outlier channel, as LLM activations have
    head = ScreenedLMHead(weight)
    exact = x @ weight.T
    assert torch.equal(head(x).argmax(dim=1), exact.argmax(dim=1))
    approximate, _ = head.approximate(x)
    assert bool((approximate.argmax(dim=1) != exact.argmax(dim=1)).any())


@torch.inference_mode()
def test_a_row_s_logits_do_not_depend_on_its_batch(smollm2, eval_hidden):
    head = ScreenedLMHead(smollm2.model.lm_head.weight)
    batched = head(eval_hidden[:8])
    for i in range(8):
        assert torch.equal(head(eval_hidden[i:i + 1])[0], batched[i])


def test_quantized_models_screen_their_head_and_the_float_model_does_not(smollm2):
    from ref_engine.model.loader import quantized

    assert smollm2.model.screened_lm_head is None
    int4 = quantized(smollm2, "int4")
    assert isinstance(int4.model.screened_lm_head, ScreenedLMHead)
    assert int4.model.screened_lm_head.weight is int4.model.lm_head.weight  # shared, not copied
