"""A context-compacting agent: every `every` turns it rewrites its own history, as long-horizon agents do to stay
within their context (SWE-agent's history processors, summarising agents): the system prompt stays, the turns
before the last `keep_turns` are replaced by one summary message, and the session goes on from there.

Through the capture proxy each rewrite is one fork: the rewritten prompt shares the system prompt (and the
template's opening) with the calls before it, and token-in/token-out then extends the fork again. The proxy
records the fork by reference from its fork point (`schemas.prompt_refs`: only the ids after the shared prefix
travel), and the trajectory processor grows one branch per rewrite, trained as such (docs/long_horizon.md).

`ContextCompactor` is the policy (pure: messages in, messages out; `bench/long_horizon.py --rewrite-every N`
drives sessions with it); `CompactingAgent` is the loop around a chat client and a tool.

`python -m examples.context_rewriting.agent --base-url http://127.0.0.1:8100/v1 --api-key KEY --model NAME`
runs one session whose tool echoes a long listing, and prints how many calls and rewrites it made.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import openai

from agents_adapter.sdk import AgentSession

Message = dict[str, Any]


@dataclass(frozen=True)
class ContextCompactor:
    """Every `every` turns: the system prompt, one summary of the dropped turns, the last `keep_turns` turns."""

    every: int
    keep_turns: int = 2

    def __post_init__(self) -> None:
        if self.every < 1 or self.keep_turns < 0:
            raise ValueError(f"every={self.every} must be >= 1 and keep_turns={self.keep_turns} >= 0")

    def due(self, turn: int) -> bool:
        """Whether the history is rewritten before turn `turn` (0-based; never before the first)."""
        return turn > 0 and turn % self.every == 0

    def rewrite(self, messages: Sequence[Message]) -> list[Message]:
        """The compacted history (`messages` ends with the model's last reply): what the agent sends from now on.
        A turn is what the agent sent (from just after a reply) and the reply to it."""
        head = [m for m in messages[:1] if m.get("role") == "system"]
        body = list(messages[len(head):])
        starts = [i for i, m in enumerate(body) if m.get("role") != "assistant" and
                  (i == 0 or body[i - 1].get("role") == "assistant")]  # where each turn begins
        kept_from = starts[-self.keep_turns] if len(starts) >= self.keep_turns else 0
        cut = kept_from if self.keep_turns else len(body)
        dropped, kept = body[:cut], body[cut:]
        if not dropped:
            return list(messages)
        return [*head, {"role": "user", "content": summary(dropped)}, *kept]


def summary(dropped: Sequence[Message]) -> str:
    """What the agent keeps of the turns it drops: their count and the first line of each tool output."""
    firsts = [str(m.get("content") or "").split("\n", 1)[0][:80] for m in dropped if m.get("role") != "assistant"]
    return f"[context compacted: {len(dropped)} earlier messages] " + " | ".join(firsts)


class CompactingAgent:
    """Asks the model, runs the tool on each reply, sends the output back; compacts its history when due."""

    def __init__(self, model: str, compactor: ContextCompactor, *, max_turns: int = 40, max_tokens: int = 64) -> None:
        self.model, self.compactor, self.max_turns, self.max_tokens = model, compactor, max_turns, max_tokens
        self.rewrites = 0

    def run(self, client: openai.OpenAI, system: str, task: str, tool: Callable[[str], str]) -> list[Message]:
        messages: list[Message] = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        for turn in range(self.max_turns):
            if self.compactor.due(turn):
                last = messages.pop()  # the new tool output goes after the summary and the kept turns
                messages = [*self.compactor.rewrite(messages), last]
                self.rewrites += 1
            request: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
            reply = client.chat.completions.create(**request)
            content = reply.choices[0].message.content or ""
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": tool(content)}]
        return messages


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.context_rewriting.agent",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base-url", required=True, help="the proxy's OpenAI base URL (…/v1)")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="turns between rewrites")
    args = parser.parse_args(argv)
    agent = CompactingAgent(args.model, ContextCompactor(args.every), max_turns=args.turns)

    def listing(reply: str) -> str:
        return "\n".join(f"file_{i}.py  {len(reply) * i} bytes" for i in range(40))

    with AgentSession(args.base_url, args.api_key) as session:
        messages = agent.run(session.client, "You explore a repository.", "List the files.", listing)
        session.reward = 0.0
    print(f"{args.turns} calls, {agent.rewrites} rewrites, final history {len(messages)} messages")


if __name__ == "__main__":
    main()
