"""The flags of `serving-lab serve` (vLLM's `cli_args.py`), kept apart from the server so that
`serving-lab --help` parses them without importing torch or FastAPI.

The model and the engine knobs are left out of the namespace unless given (`argparse.SUPPRESS`), so that
with `--config MANIFEST` (serving_lab/cli.py) a flag overrides the manifest only when it was given.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import argparse

from core.config import DTYPES, INT4_GROUP_SIZES, KV_CACHE_DTYPES, QUANTIZATION_METHODS


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=argparse.SUPPRESS,
                        help="GGUF file or Hugging Face folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--config", metavar="MANIFEST", default=None,
                        help="a deployment manifest (YAML) for the model and every engine knob; flags override it")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=argparse.SUPPRESS,
                        help="the name clients use (default: the model's)")
    parser.add_argument("--api-key-file", default=None,
                        help='JSON: {"<key>": {"tenant": "...", "weight": 1.0, "max_num_seqs": null, '
                             '"max_pending_requests": null, "token_budget": null, "budget_window_s": 60, '
                             '"admin": false}}; without it every client is one tenant (a shared prefix cache)')
    parser.add_argument("--dtype", default=argparse.SUPPRESS, choices=list(DTYPES),
                        help="the weights' dtype (default: float32, the reference)")
    parser.add_argument("--quantization", default=argparse.SUPPRESS, choices=list(QUANTIZATION_METHODS),
                        help="int8: 8-bit weights; int4: 4-bit weights, a GGUF's own Q4_1 blocks; both "
                             "weight-only (ref_engine/model/quantization.py)")
    parser.add_argument("--quantization-group-size", type=int, default=argparse.SUPPRESS,
                        help=f"weights per int4 scale and zero for a model quantized at load: "
                             f"{', '.join(map(str, INT4_GROUP_SIZES))} (default 32; a GGUF keeps its blocks' 32)")
    parser.add_argument("--kv-cache-dtype", default=argparse.SUPPRESS, choices=list(KV_CACHE_DTYPES),
                        help="what the KV cache stores K/V in (default: auto, the model's dtype)")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                        help="run the model eagerly (the default); --no-enforce-eager compiles it at start")
    parser.add_argument("--tensor-parallel-size", type=int, default=argparse.SUPPRESS,
                        help="worker processes the model is split over (default: 1, in the engine's process)")
    parser.add_argument("--allow-cpu-oversubscription", action="store_true", default=argparse.SUPPRESS,
                        help="on a CPU, run more tensor-parallel ranks than cores (they take turns: slower, for study)")
    parser.add_argument("--max-model-len", type=int, default=argparse.SUPPRESS)
    parser.add_argument("--max-num-seqs", type=int, default=argparse.SUPPRESS)
    parser.add_argument("--scheduling-policy", default=None, choices=["fcfs", "priority", "fair"])
    parser.add_argument("--max-pending-requests", type=int, default=256,
                        help="admission control: open requests beyond this get 429")
    parser.add_argument("--max-logprobs", type=int, default=20,
                        help="the most logprobs / top_logprobs a request may ask for (vLLM's default: 20)")
    parser.add_argument("--max-request-bytes", type=int, default=1 << 20, help="larger bodies get 413")
    parser.add_argument("--chat-template", default=None, help="a jinja2 chat template file (default: the model's)")
    parser.add_argument("--trace-requests", action="store_true",
                        help="record each request's timeline; read it at GET /debug/trace/<X-Request-Id>")
    parser.add_argument("--dashboard", action="store_true",
                        help="serve a live dashboard at /dashboard (the batch, the KV pool, queues, tenants, "
                             "latencies); like /metrics it needs no key, and it shows the tenants' names")
    parser.add_argument("--graceful-timeout", type=float, default=30.0,
                        help="seconds open requests may run after SIGINT/SIGTERM (new ones get 503 meanwhile)")
