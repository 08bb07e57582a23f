"""`serving-lab`: the command line (pull the default model, generate, serve, bench serve, run the demo,
calibrate).

Lesson: lessons/00-orientation.md (how to run).
"""

from __future__ import annotations

import argparse
import sys


def _pull(args: argparse.Namespace) -> None:
    # Each command imports only what it runs, so `serving-lab pull` and `--help` start without torch.
    from ref_engine.model.store import default_model_path

    print(default_model_path())


def _generate(args: argparse.Namespace) -> None:
    from ref_engine import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}]) if args.chat else p
               for p in args.prompts]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    for prompt, out in zip(args.prompts, llm.generate(prompts, params, use_tqdm=False)):
        print(f"### {prompt}\n{out.outputs[0].text}\n")


def _serve(args: argparse.Namespace) -> None:
    from ref_engine.entrypoints.openai.api_server import run_server

    run_server(args)


def _bench_serve(args: argparse.Namespace) -> None:
    from serving_lab.bench_serve import main as bench_serve_main

    bench_serve_main(args)


def _calibrate(args: argparse.Namespace) -> None:
    from serving_lab.calibrate import calibrate

    calibrate(args.model, dtype=args.dtype)


def _demo(args: argparse.Namespace) -> None:
    from serving_lab.demo import main as demo_main

    demo_main(out_dir=args.out, model=args.model)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="serving-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pull", help="download the default SmolLM2-135M-Instruct GGUF into the cache")
    p.set_defaults(func=_pull)

    p = sub.add_parser("generate", help="generate text with the reference engine")
    p.add_argument("prompts", nargs="+")
    p.add_argument("--model", default=None, help="GGUF file or Hugging Face folder (default: SmolLM2-135M)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-chat", dest="chat", action="store_false", help="send the raw prompt, no chat template")
    p.set_defaults(func=_generate)

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (streaming, /metrics) on the engine")
    from ref_engine.entrypoints.openai.cli_args import add_serve_args

    add_serve_args(p)
    p.set_defaults(func=_serve)

    p = sub.add_parser("bench", help="benchmarks: `bench serve` loads an OpenAI-compatible server")
    bench = p.add_subparsers(dest="bench_command", required=True)
    p = bench.add_parser("serve", help="send a workload to a server and measure TTFT, ITL, TPOT, throughput")
    from serving_lab.bench_serve import add_bench_serve_args

    add_bench_serve_args(p)
    p.set_defaults(func=_bench_serve)

    p = sub.add_parser("calibrate", help="measure this machine with the engine and save its simulator profile")
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.set_defaults(func=_calibrate)

    p = sub.add_parser("demo", help="the course demo: engine and simulator side by side, with a report")
    p.add_argument("--model", default=None)
    p.add_argument("--out", default="reports/demo", help="folder for the report")
    p.set_defaults(func=_demo)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"serving-lab: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
