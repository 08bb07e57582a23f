"""The compiled decoder: `enforce_eager=False` (vLLM's knob) runs the model's forward through `torch.compile`.

What is compiled, and why so little: a step's matrix products are most of its time (benchmarks/RESULTS.md,
"Where a step's time goes") and inductor calls the same GEMMs eager does; what it can take away is the rest,
the elementwise work around them (RMSNorm, rotary, SiLU-and-mul, residual adds) fused into a few loops, and
the per-operator dispatch. So:

* `paged_attention` stays eager (`EAGER`): its shapes depend on the batch's
  requests (per-request loops, gathers of each request's blocks). Each decoder layer then compiles to two
  graphs, the dense math before attention (norm, q|k|v, rotary) and after it (o_proj, residual, norm, MLP);
  the layer loop around them runs in Python (a graph break inside a loop makes torch run that frame eagerly
  and compile the frames it calls).
* The token dimension is dynamic (`dynamic=True`): one graph serves every flat batch of two or more tokens
  and one a single token (torch specialises size 1), so no padding to fixed "capture sizes" (CUDA graphs
  need them, and on a GPU, where graphs replace compiling, decode steps do pad: ref_engine/cuda_graphs.py;
  padding a CPU's step would add matmul rows, the step's cost).
* Parameters are graph inputs, not constants (no inductor `freezing`), so the 30 layers, and every engine
  in the process, share those graphs: one compiled function, made once per process.
* Inductor keeps what it compiled in its on-disk cache, so a second process only re-traces.

The compiled path runs the model's own forward, the same code as eager, and float32 stays
token-exact with eager (tests/engine/test_compile.py). A compile that fails (e.g. no C compiler) raises
`CompileError`, which names the knob that turns compiling off.

Lesson: lessons/07-tuning-knobs.md (what compiling buys on the course CPU).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ref_engine.model import linear, llama
from ref_engine.model.llama import LlamaForCausalLM

Forward = Callable[..., torch.Tensor]


class CompileError(RuntimeError):
    """torch.compile of the decoder failed; `enforce_eager=True` runs the model without compiling."""


# What the compiled decoder calls eagerly, by the module and name the layers look it up under: attention (see
# above) and tensor parallelism's all-reduce (a collective and its timer, nothing to fuse). Wrapped in
# torch.compiler.disable on the first compile, not by a decorator where each is defined: the decorator imports
# torch._dynamo (~1.5 s), which every engine and worker process would pay, compiling or not.
EAGER = ((llama, "paged_attention"), (linear, "tensor_model_parallel_all_reduce"))


@functools.cache
def _compiled_forward() -> Forward:
    for module, name in EAGER:
        setattr(module, name, torch.compiler.disable(getattr(module, name)))
    return torch.compile(LlamaForCausalLM.forward, dynamic=True)


def compile_decoder(model: LlamaForCausalLM) -> Forward:
    """`model`'s forward through torch.compile (compiled lazily, on the first call of each shape). A
    compiler failure raises `CompileError` with its cause in one line, not the compiler's stack."""
    compiled = _compiled_forward()

    def forward(*args: object) -> torch.Tensor:
        try:
            return compiled(model, *args)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            raise CompileError(f"torch.compile of the decoder failed ({error.inner_exception!r:.300}); "
                               "pass enforce_eager=True (serving-lab: --enforce-eager) to run it eagerly") from None

    return forward
