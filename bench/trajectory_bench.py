"""Trajectory processor core on a synthetic agent workload: throughput, storage ratio, memory.

Workload (per session): a 800-1,000-token system+task prompt, then 20 turns; each turn's prompt is the
previous prompt + the previous reply (200 generated tokens) + 0-20 tool/user tokens, so prompts grow
from ~1K to ~5K tokens. With probability 5% a turn forks instead: the agent edits its history (cut at a
random point after the first prompt, 20-200 new given tokens) and the session continues on the fork.
Calls of all sessions are interleaved round-robin, as the processor reads them from the topic.

Measures, single-threaded (one worker):
  - PrefixTree.insert alone, and insert + TreeDelta.to_bytes (what the Faust table persists);
  - the whole assembler (on_call per call, then on_session_ended building and encoding the Trajectory);
  - storage: tokens in the calls (what storing each call whole costs) vs tokens in the tree;
  - delta bytes per call vs the packed size of the call's tokens;
  - memory per open session (tracemalloc, trees of finished 20-turn sessions kept alive).

    .venv/bin/python bench/trajectory_bench.py [--sessions 64] [--turns 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

from agents_adapter.processor.assembler import AssemblerConfig, TrajectoryAssembler
from agents_adapter.processor.prefix_tree import PrefixTree
from schemas.events import LLMCall, SessionEnded, encode_event

VOCAB = 151_000
PACKED_BYTES_PER_TOKEN = 13  # i32 id + u8 mask + f32 logprob + i32 version, as a tree stores them


def make_session(rng: random.Random, sid: str, turns: int, reply: int, branch_prob: float) -> list[LLMCall]:
    first = [rng.randrange(VOCAB) for _ in range(rng.randint(800, 1_000))]
    history = first
    calls = []
    for turn in range(turns):
        fork = turn > 0 and rng.random() < branch_prob
        if fork:
            cut = rng.randint(len(first), len(history))
            prompt = history[:cut] + [rng.randrange(VOCAB) for _ in range(rng.randint(20, 200))]
        else:
            prompt = history
        output = [rng.randrange(VOCAB) for _ in range(reply)]
        version = 7 + turn // 5
        calls.append(LLMCall(
            event_id=f"{sid}-e{turn}", ts_ms=1_000 * turn, producer="adapter-0", correlation_id=sid,
            call_id=f"{sid}-c{turn}", session_id=sid, agent_id="agent", task_id="task", group_id=f"g{sid}",
            model="bench", turn=turn, prompt_ids=tuple(prompt), output_ids=tuple(output),
            output_logprobs=tuple(-rng.random() for _ in output), output_versions=(version,) * reply,
            finish_reason="stop", request_ms=1_000 * turn, completed_ms=1_000 * turn + 900, drift=fork,
        ))
        history = prompt + output + [rng.randrange(VOCAB) for _ in range(rng.randint(0, 20))]
    return calls


def interleave(sessions: list[list[LLMCall]]) -> list[LLMCall]:
    return [s[t] for t in range(max(map(len, sessions))) for s in sessions if t < len(s)]


def best_of(repeats: int, run: Callable[[], None]) -> float:
    """Median wall time of `repeats` runs (the machine is shared: the median resists noise)."""
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--reply", type=int, default=200)
    parser.add_argument("--branch-prob", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    sessions = [make_session(rng, f"s{i}", args.turns, args.reply, args.branch_prob) for i in range(args.sessions)]
    stream = interleave(sessions)
    n_calls = len(stream)
    prompt_lens = [len(c.prompt_ids) for c in stream]
    ends = [
        SessionEnded(event_id=f"end-{s[0].session_id}", ts_ms=10**6, session_id=s[0].session_id, agent_id="agent",
                     task_id="task", group_id=s[0].group_id, reward=1.0, num_calls=len(s))
        for s in sessions
    ]

    def insert_only() -> None:
        trees: dict[str, PrefixTree] = {}
        for call in stream:
            trees.setdefault(call.session_id, PrefixTree()).insert(call)

    delta_bytes: list[int] = []

    def insert_and_serialise() -> None:
        delta_bytes.clear()
        trees: dict[str, PrefixTree] = {}
        for call in stream:
            delta_bytes.append(len(trees.setdefault(call.session_id, PrefixTree()).insert(call).to_bytes()))

    trajectory_bytes: list[int] = []

    def assembler() -> None:
        trajectory_bytes.clear()
        core = TrajectoryAssembler(AssemblerConfig(group_size=1))
        for call in stream:
            for delta in core.on_call(call).deltas:
                delta.to_bytes()
        for end in ends:
            trajectory_bytes.extend(len(encode_event(t)) for t in core.on_session_ended(end).trajectories)

    t_insert = best_of(args.repeats, insert_only)
    t_delta = best_of(args.repeats, insert_and_serialise)
    t_core = best_of(args.repeats, assembler)

    trees: dict[str, PrefixTree] = {}
    for call in stream:
        trees.setdefault(call.session_id, PrefixTree()).insert(call)
    in_calls = sum(t.tokens_in_calls for t in trees.values())
    in_tree = sum(t.tokens_in_tree for t in trees.values())
    call_packed = sum(len(c.prompt_ids) + len(c.output_ids) for c in stream) * PACKED_BYTES_PER_TOKEN
    del trees

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept: dict[str, PrefixTree] = {}
    for call in stream:
        kept.setdefault(call.session_id, PrefixTree()).insert(call)
    for tree in kept.values():
        tree.min_version  # noqa: B018 - caches included, as an open session holds them
    gc.collect()
    per_session = (tracemalloc.get_traced_memory()[0] - base) / len(kept)
    tracemalloc.stop()
    tree_tokens_per_session = in_tree / len(kept)

    rows = [
        ("workload", f"{args.sessions} sessions x {args.turns} turns, {n_calls} calls, reply {args.reply}, "
                     f"branch {args.branch_prob:.0%}"),
        ("prompt tokens min / mean / max", f"{min(prompt_lens)} / {statistics.mean(prompt_lens):.0f} / "
                                           f"{max(prompt_lens)}"),
        ("insert: calls/s per worker", f"{n_calls / t_insert:,.0f}  ({t_insert / n_calls * 1e6:.0f} us/call, "
                                       f"{sum(prompt_lens) / t_insert / 1e6:.1f} M prompt tokens/s)"),
        ("insert + delta bytes: calls/s", f"{n_calls / t_delta:,.0f}  ({t_delta / n_calls * 1e6:.0f} us/call)"),
        ("assembler end to end: calls/s", f"{n_calls / t_core:,.0f}  (incl. {len(ends)} trajectories built + "
                                          f"encoded, {statistics.mean(trajectory_bytes) / 1024:.0f} KiB each)"),
        ("tokens in calls / in trees", f"{in_calls:,} / {in_tree:,}"),
        ("delta bytes per call (mean)", f"{statistics.mean(delta_bytes):,.0f}  vs {call_packed / n_calls:,.0f} "
                                        f"packed call bytes ({call_packed / sum(delta_bytes):.1f}x smaller)"),
        ("memory per open session", f"{per_session / 1024:,.0f} KiB for {tree_tokens_per_session:,.0f} tree "
                                    f"tokens ({per_session / tree_tokens_per_session:.1f} B/token)"),
    ]
    width = max(len(k) for k, _ in rows)
    print("trajectory processor core (single worker)")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print(f"ratio naive/tree storage: {in_calls / in_tree:.2f}x")


if __name__ == "__main__":
    main()
