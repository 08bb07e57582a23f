"""A deployment manifest as the `vllm serve` command line that runs the same deployment on a real cluster.

Flag names are vLLM's own (`EngineArgs.add_cli_args` in vllm/engine/arg_utils.py); tests check the output
against that list. Where a manifest knob has no vLLM twin, or vLLM has no flag because it always behaves
one way, the command is followed by a `#` comment line that says so, instead of a flag that would not
mean the same thing. The comments come after the command, so the whole output can be pasted into a shell.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#budget-knobs (vLLM's prefill knobs next to the
manifest's budgets).
"""

from __future__ import annotations

import json
import shlex

from serving_lab.manifest import DEFAULT_MODEL, NGRAM_DRAFT, Manifest


def vllm_serve_command(manifest: Manifest) -> str:
    """`vllm serve MODEL --flag value ...`, one flag per line, then the notes on what did not translate."""
    config = manifest.engine_config()
    engine, api, scheduler = manifest.engine, manifest.api, manifest.scheduler
    flags: list[tuple[str, object]] = []
    notes: list[str] = []
    if engine.model == DEFAULT_MODEL:
        notes.append(f"engine.model: {DEFAULT_MODEL} is the bf16 original of the Q4_1 GGUF our engine runs")
    if engine.served_model_name is not None:
        flags.append(("--served-model-name", engine.served_model_name))
    if engine.trust_remote_code:
        flags.append(("--trust-remote-code", None))
    flags.append(("--tensor-parallel-size", engine.tensor_parallel_size))
    if engine.dtype is not None:
        flags.append(("--dtype", engine.dtype))
    if engine.kv_cache_dtype == "bfloat16":
        flags.append(("--kv-cache-dtype", engine.kv_cache_dtype))
    elif engine.kv_cache_dtype == "float32":
        notes.append("engine.kv_cache_dtype: float32 has no --kv-cache-dtype value in vLLM; its 'auto' stores "
                     "K/V in the model's dtype, so --dtype float32 gives it")
    if engine.enforce_eager:
        flags.append(("--enforce-eager", None))
    if engine.quantization is not None:
        notes.append(f"engine.quantization: {engine.quantization} (our on-the-fly W8A8 on x86 CPU kernels) has no "
                     "vllm serve flag: vLLM runs int8 W8A8 from a checkpoint quantized ahead of time (e.g. with "
                     "llm-compressor); its on-the-fly 8-bit path on GPUs is --quantization fp8")
    if api.request_limits.max_model_len is not None:
        flags.append(("--max-model-len", api.request_limits.max_model_len))
    flags += [("--max-num-seqs", config.max_num_seqs), ("--block-size", config.block_size)]
    if scheduler.type == "continuous":
        flags += [("--enable-chunked-prefill", None), ("--max-num-batched-tokens", config.max_num_batched_tokens)]
    else:
        notes.append("scheduler.type: static has no vLLM twin: vLLM always batches continuously")
    if scheduler.prefill_budget_tokens is not None:
        flags.append(("--long-prefill-token-threshold", scheduler.prefill_budget_tokens))
        notes.append(f"scheduler.prefill_budget_tokens: {scheduler.prefill_budget_tokens} caps a step's prefill "
                     "tokens over all requests; vLLM has no such cap. --long-prefill-token-threshold caps one "
                     "request's chunk (the same while one prompt is mid-prefill), and --max-num-batched-tokens "
                     "is the prefill plus the decode budget")
    if scheduler.decode_batch_max_tokens is not None:
        notes.append(f"scheduler.decode_batch_max_tokens: {scheduler.decode_batch_max_tokens} has no vLLM twin: "
                     "vLLM bounds decode rows only by --max-num-seqs")
    if api.admission.fairness == "none":
        flags.append(("--scheduling-policy", "fcfs"))
    else:
        notes.append("api.admission.fairness: per_tenant_budgets has no vLLM twin: --scheduling-policy takes "
                     "only fcfs or priority")
    notes.append(f"api.admission.preempt: {api.admission.preempt}"
                 + (" is what vLLM V1 always does (no flag)" if api.admission.preempt == "recompute"
                    else " has no vLLM V1 twin: V1 preempts by recompute only"))
    if manifest.cache.allocation != "on_demand":
        notes.append(f"cache.allocation: {manifest.cache.allocation} (lesson 2's baseline) has no vLLM twin: "
                     "vLLM allocates blocks on demand")
    spec = manifest.optional.speculative_decoding
    if spec is not None:
        speculative = {"method": "ngram"} if spec.draft_model == NGRAM_DRAFT else {"model": spec.draft_model}
        if spec.draft_model.startswith("self:"):
            notes.append(f"optional.speculative_decoding.draft_model: {spec.draft_model} (the target's first "
                         "layers as the draft) has no vLLM twin; name a draft model to speculate there")
        else:
            flags.append(("--speculative-config",
                          json.dumps({**speculative, "num_speculative_tokens": spec.speculative_tokens})))
    notes.append(f"api: vllm serve speaks the {api.protocol} API; streaming (stream: {str(api.stream).lower()}) "
                 "is chosen per request, not by a flag")
    notes.append(f"metrics: {', '.join(manifest.metrics)} are read from /metrics (README, 'The deployment "
                 "manifest')")
    lines = [f"vllm serve {shlex.quote(engine.model)}"]
    lines += [f"  {flag}" + ("" if value is None else f" {shlex.quote(str(value))}") for flag, value in flags]
    command = " \\\n".join(lines)
    return "\n".join([command, *(f"# {note}" for note in notes)])
