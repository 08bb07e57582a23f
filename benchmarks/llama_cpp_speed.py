"""llama.cpp's single-stream speed on the same GGUF, in process (llama-cpp-python), for engine_speed.py.

    <a python with llama-cpp-python> benchmarks/llama_cpp_speed.py GGUF [--threads 2] [--prompt-len 128]
                                                                     [--output-len 128]

Run by `engine_speed.py --llama-cpp PYTHON` with another environment's Python: llama-cpp-python is never a
dependency of this project (it compiles llama.cpp at install), so this script imports nothing of ours. The
workload is engine_speed.py's single stream: the same 128 prompt token ids, 128 greedy output tokens with
EOS ignored; the time covers prefill and decode, as the engine's does. Prints one number, output tokens/s,
the faster of two runs after a warm-up.
"""

from __future__ import annotations

import argparse
import time

from llama_cpp import Llama


def run(llm: Llama, prompt: list[int], output_len: int) -> float:
    start = time.perf_counter()
    for n, _ in enumerate(llm.generate(prompt, top_k=1, temp=0.0, reset=True), start=1):
        if n == output_len:
            break
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    args = parser.parse_args()
    llm = Llama(args.gguf, n_ctx=args.prompt_len + args.output_len + 16, n_threads=args.threads,
                n_threads_batch=args.threads, verbose=False)
    prompt = [1000 + (31 * j) % 20000 for j in range(args.prompt_len)]  # engine_speed.prompts(1)[0]
    run(llm, prompt, args.output_len)
    print(f"{args.output_len / min(run(llm, prompt, args.output_len) for _ in range(2)):.1f}")


if __name__ == "__main__":
    main()
