"""A deployment manifest as the `vllm serve` command line that runs the same deployment on a real cluster.

Flag names are vLLM's own (`EngineArgs.add_cli_args` in vllm/engine/arg_utils.py), written for the release
named in `VLLM_VERSION`; tests check the output against that list. Every key of the manifest is accounted
for: it becomes a flag, or, where it has no vLLM twin or vLLM has no flag because it always behaves one way,
a `#` comment line that says so, instead of a flag that would not mean the same thing. The comments come
after the command, so the whole output can be pasted into a shell.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#budget-knobs (vLLM's prefill knobs next to the
manifest's budgets).
"""

from __future__ import annotations

import json
import shlex

from serving_lab.manifest import DEFAULT_MODEL, NGRAM_DRAFT, Manifest

# The vLLM the flags were checked against: vllm/engine/arg_utils.py at commit 99d7eb5d6a51 of
# github.com/vllm-project/vllm, a v0.11 release (its deprecation notes say "will be removed in v0.12.0").
VLLM_VERSION = "vLLM v0.11 (vllm/engine/arg_utils.py at commit 99d7eb5d6a51)"


def vllm_serve_command(manifest: Manifest) -> str:
    """`vllm serve MODEL --flag value ...`, one flag per line, then the notes on what did not translate."""
    config = manifest.engine_config()
    engine, api, cache, scheduler = manifest.engine, manifest.api, manifest.cache, manifest.scheduler
    flags: list[tuple[str, object]] = []
    notes: list[str] = [f"flags as {VLLM_VERSION} takes them",
                        f"service: {manifest.service} names the deployment; vllm serve has no such flag",
                        f"engine.framework: {engine.framework}, this command"]
    if engine.model == DEFAULT_MODEL:
        notes.append(f"engine.model: {DEFAULT_MODEL} is the bf16 original of the Q4_1 GGUF our engine runs")
    if engine.served_model_name is not None:
        flags.append(("--served-model-name", engine.served_model_name))
    if engine.trust_remote_code:
        flags.append(("--trust-remote-code", None))
    else:
        notes.append("engine.trust_remote_code: false is vLLM's default (no --trust-remote-code)")
    flags.append(("--tensor-parallel-size", engine.tensor_parallel_size))
    if engine.dtype is not None:
        flags.append(("--dtype", engine.dtype))
    if engine.kv_cache_dtype == "bfloat16":
        flags.append(("--kv-cache-dtype", engine.kv_cache_dtype))
    elif engine.kv_cache_dtype in ("float32", "float16"):
        notes.append(f"engine.kv_cache_dtype: {engine.kv_cache_dtype} has no --kv-cache-dtype value in vLLM; its "
                     f"'auto' stores K/V in the model's dtype, so --dtype {engine.kv_cache_dtype} gives it")
    if engine.enforce_eager:
        flags.append(("--enforce-eager", None))
    if engine.quantization is not None:
        notes.append(f"engine.quantization: {engine.quantization} (our CPU kernels, quantized at load) has no "
                     "vllm serve flag: vLLM runs int8 W8A8 and int4 weight-only from a checkpoint quantized ahead "
                     "of time (e.g. with llm-compressor, or GPTQ/AWQ for int4); its on-the-fly 8-bit path on "
                     "GPUs is --quantization fp8")
    if api.request_limits.max_model_len is not None:
        flags.append(("--max-model-len", api.request_limits.max_model_len))
    flags += [("--max-num-seqs", config.max_num_seqs), ("--block-size", config.block_size)]
    if scheduler.type == "static":
        notes.append("scheduler.type: static has no vLLM twin: vLLM always batches continuously")
    else:
        chunking = "--enable-chunked-prefill" if config.enable_chunked_prefill else "--no-enable-chunked-prefill"
        flags += [(chunking, None), ("--max-num-batched-tokens", config.max_num_batched_tokens)]
    if scheduler.prefill_budget_tokens is not None:
        flags.append(("--long-prefill-token-threshold", scheduler.prefill_budget_tokens))
        notes.append(f"scheduler.prefill_budget_tokens: {scheduler.prefill_budget_tokens} caps a step's prefill "
                     "tokens over all requests; vLLM has no such cap. --long-prefill-token-threshold caps one "
                     "request's chunk (the same while one prompt is mid-prefill), and --max-num-batched-tokens "
                     "is the prefill plus the decode budget")
    if scheduler.decode_batch_max_tokens is not None:
        notes.append(f"scheduler.decode_batch_max_tokens: {scheduler.decode_batch_max_tokens} decode tokens per "
                     "step (a row with k drafts counts 1 + k) has no vLLM twin: vLLM bounds decode rows only by "
                     "--max-num-seqs and all tokens by --max-num-batched-tokens")
    if api.admission.fairness == "none":
        flags.append(("--scheduling-policy", "fcfs"))
    else:
        notes.append("api.admission.fairness: per_tenant_budgets has no vLLM twin: --scheduling-policy takes "
                     "only fcfs or priority")
    if manifest.tenants:
        notes.append(f"tenants: {', '.join(manifest.tenants)} (weights, caps, budgets) have no vLLM twin: vLLM's "
                     "scheduler knows no tenants; put the pending caps and token budgets in a gateway before it")
    notes.append(f"api.admission.preempt: {api.admission.preempt}"
                 + (" is what vLLM V1 always does (no flag)" if api.admission.preempt == "recompute"
                    else " has no vLLM V1 twin: V1 preempts by recompute only"))
    notes.append(f"cache.block_table: {cache.block_table} is vLLM's only layout, a paged block table per "
                 "sequence (no flag)")
    if cache.allocation == "on_demand":
        notes.append("cache.allocation: on_demand is what vLLM always does (no flag)")
    else:
        notes.append(f"cache.allocation: {cache.allocation} (lesson 2's baseline) has no vLLM twin: "
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
        if "model" in speculative:
            notes.append("optional.speculative_decoding: vLLM v0.11 refuses a separate draft model at start "
                         "(NotImplementedError); a later release with method draft_model runs this --speculative-config")
    notes.append(f"api.protocol: {api.protocol} is what vllm serve speaks (no flag)")
    notes.append(f"api.stream: {str(api.stream).lower()}: vllm serve streams a request that asks "
                 "(\"stream\": true), chosen per request, not by a flag"
                 + ("" if api.streaming else "; put a gateway before it to refuse streaming"))
    notes.append(f"metrics: {', '.join(manifest.metrics)} are read from /metrics (README, 'The deployment "
                 "manifest')")
    lines = [f"vllm serve {shlex.quote(engine.model)}"]
    lines += [f"  {flag}" + ("" if value is None else f" {shlex.quote(str(value))}") for flag, value in flags]
    command = " \\\n".join(lines)
    return "\n".join([command, *(f"# {note}" for note in notes)])
