"""Constrained decoding and long prompts on the demo model (CPU): not a test, numbers measured in one run.

1. Decode throughput with and without a grammar: the same requests (same prompts, seeds, budget), once
   free (`ignore_eos`) and once under the proxy's forced-tool-call grammar for a tool whose argument is a
   long string (`minLength` keeps every request decoding to its budget, so both sides generate the same
   number of tokens). The masked side pays for llguidance's mask of each row at each step and the -inf fill.
2. Prefill time (and the process's peak RSS) of one long prompt: what a stock agent's first call costs
   (smolagents' CodeAgent sends ~8.7K tokens).

Run: `.venv/bin/python bench/constrained_decode.py` (~3 min on 2 cores; `--prefill ''` skips part 2).
Last line: `ratio masked vs unmasked decode @bs16: X.XXx`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.constraints import Constraints
from inference_svc.default_model import DefaultModelSpec, create_default_model
from inference_svc.engine import NativeEngine
from schemas.inference.types import SamplingOptions

CODE_TOOL = {"type": "function", "function": {"name": "python", "description": "runs code", "parameters": {
    "type": "object", "properties": {"code": {"type": "string", "minLength": 4000}}, "required": ["code"]}}}


def decode_tps(engine: NativeEngine, prompt: list[int], batch: int, new_tokens: int, ebnf: str | None) -> float:
    """Generated tokens per second of `batch` requests decoded together."""
    started = time.perf_counter()
    futures = [engine.submit(prompt, SamplingOptions(max_new_tokens=new_tokens, seed=i, ignore_eos=ebnf is None,
                                                     ebnf=ebnf)) for i in range(batch)]
    results = [f.result() for f in futures]
    elapsed = time.perf_counter() - started
    assert all(len(r.output_ids) == new_tokens for r in results), [len(r.output_ids) for r in results]
    return batch * new_tokens / elapsed


def prefill_s(engine: NativeEngine, tokens: int) -> float:
    ids = torch.randint(0, 256, (tokens,), generator=torch.Generator().manual_seed(tokens)).tolist()
    started = time.perf_counter()
    engine.generate(ids, SamplingOptions(max_new_tokens=1))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per point (the median is shown)")
    parser.add_argument("--prefill", default="8192,16384,32000", help="prompt lengths of part 2 ('' skips it)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the services run with 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = create_default_model(Path(tempfile.mkdtemp(prefix="sflow-bench-")), DefaultModelSpec(tokenizer="bpe"))
    codec = ChatCodec.from_model_dir(model_dir)
    grammar = Constraints(codec).grammar([CODE_TOOL], "required", False, None).ebnf
    prompt = codec.encode(codec.render([{"role": "user", "content": "print the first primes"}], [CODE_TOOL],
                                       add_generation_prompt=True))
    batches = [int(b) for b in args.batch_sizes.split(",")]
    with NativeEngine(model_dir, max_running_requests=max(batches), prefix_cache_slots=0) as engine:
        decode_tps(engine, prompt, 2, 8, grammar)  # warm-up: the llguidance tokenizer, torch's first calls
        rows = []
        for batch in batches:  # free and masked runs alternate, so a busy moment of the machine hits both
            runs = [(decode_tps(engine, prompt, batch, args.new_tokens, None),
                     decode_tps(engine, prompt, batch, args.new_tokens, grammar)) for _ in range(args.repeats)]
            rows.append((batch, statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)))
        lengths = [int(n) for n in args.prefill.split(",") if n]
        prefills = [(n, prefill_s(engine, n), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
                    for n in lengths]
    print(f"demo model (DefaultModelSpec(tokenizer='bpe'), vocab {len(codec.tokenizer)}), {args.threads} thread(s), "
          f"prompt {len(prompt)} tokens, {args.new_tokens} new tokens per request")
    print(f"{'decode tok/s':<24}{'unmasked':>12}{'masked':>12}{'ratio':>9}")
    for batch, free, masked in rows:
        print(f"{f'batch {batch}':<24}{free:>12.0f}{masked:>12.0f}{masked / free:>8.2f}x")
    if prefills:
        print(f"{'prefill':<24}{'seconds':>12}{'tok/s':>12}{'peak RSS GiB':>14}")
        for n, seconds, rss in prefills:
            print(f"{f'{n} tokens':<24}{seconds:>12.1f}{n / seconds:>12.0f}{rss:>14.2f}")
    last = rows[-1]
    print(f"ratio masked vs unmasked decode @bs{last[0]}: {last[2] / last[1]:.2f}x")


if __name__ == "__main__":
    main()
