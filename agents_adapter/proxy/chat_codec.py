"""The model's tokenizer and chat template, with the template's turn convention probed at start-up.

Token-in/token-out (`tito`) glues served ids to newly rendered messages, which is only right if the
template renders a conversation as its parts concatenated. That convention is probed, not assumed
(`ChatCodec.convention`): rendering [system, user] + [assistant A] + [next messages] must equal
render([system, user]) + OPEN + A + CLOSE + render([next messages]) for tool and non-tool turns, with and
without tools; CLOSE is what the template writes after a reply ("<|im_end|>\\n" for ChatML), OPEN how it
opens an assistant turn in history: the generation prompt, or not where the two differ (the generation
prompt prefills a think block, or history adds an empty one: Qwen3.5+, Nemotron 3, GLM-4.5), and a served
reply is then not rendered as the model wrote it: the prompts after it are `realigned` (tito). The
engine's output of a reply that stopped on <|im_end|> already holds that token, so its glue is the rest of
CLOSE ("\\n"); a reply cut by max_tokens gets all of CLOSE. A template that cannot be
split this way is refused at start-up (`TemplateError`) rather than producing prompts that differ from
what the template would give.

Tool-call arguments arrive as JSON strings (the OpenAI API's form); many templates (Qwen3.5+, GLM-4,
Nemotron 3, LFM2, Gemma 4) read them as mappings, as Hugging Face's chat format has them, and raise on a
string. Which form the template takes is probed too (`arguments_as_mapping`), and the messages rendered
are given that form.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agents_adapter.errors import TemplateError
from agents_adapter.proxy.tokenizer_files import TokenizerFiles
from schemas.inference.byte_level import bytes_to_unicode

Message = Mapping[str, Any]
_PROBE_SYSTEM: Final = "PROBE-SYSTEM"
_PROBE_USER: Final = "PROBE-USER"
_PROBE_REPLY: Final = "PROBE-REPLY"
_PROBE_NEXT: Final = "PROBE-NEXT"
_PROBE_TOOLS: Final = (
    {
        "type": "function",
        "function": {
            "name": "probe_tool",
            "description": "probe",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    },
)
_PROBE_CALL: Final = {
    "id": "call_probe",
    "type": "function",
    "function": {"name": "probe_tool", "arguments": '{"x": "1"}'},
}
#: Texts up to this length are tokenized with the GIL held (`encode`): less CPU than handing them to the
#: tokenizer's thread pool, and too short to hold other threads back.
_ENCODE_INLINE_CHARS = 4096


@dataclass(frozen=True)
class TemplateConvention:
    """How the chat template closes an assistant turn and opens the next one."""

    turn_close: str
    generation_prompt: str


class ChatCodec:
    """The model's tokenizer and chat template, plus the probed template convention."""

    def __init__(self, tokenizer: Any, eos_token_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        self.vocab_size = len(tokenizer)
        self._anchor_head: str | None = None
        self._anchor_prompt: str | None = None
        self.arguments_as_mapping = False
        self.arguments_as_mapping = self._takes_mapping_arguments()
        self.convention = self._probe()
        self.tool_call_style = self._tool_call_style()
        self._close_prefixes = {
            tok: self.convention.turn_close[len(text) :]
            for tok in self.eos_token_ids
            if (text := self.decode([tok])) and self.convention.turn_close.startswith(text)
        }
        self._byte_decoder = _byte_level_decoder(tokenizer)
        self._special_ids = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", ()))
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_model_dir(cls, path: Path) -> ChatCodec:
        """The model's tokenizer, without torch where it has a `tokenizer.json` (`tokenizer_files`)."""
        if (path / "tokenizer.json").exists():
            tokenizer: Any = TokenizerFiles.from_model_dir(path)
        else:
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            except (OSError, ValueError) as e:
                raise TemplateError(f"model_path={str(path)!r}: cannot load its tokenizer: {e}") from e
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(f"model_path={str(path)!r}: the tokenizer has no chat template")
        return cls(tokenizer, _eos_ids(path, tokenizer))

    # ----- text <-> ids

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
               *, add_generation_prompt: bool = True) -> str:
        if not messages:
            return self.convention.generation_prompt if add_generation_prompt else ""
        if self.arguments_as_mapping:
            messages = [_with_mapping_arguments(m) for m in messages]
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt, tokenize=False,
            )
        except Exception as e:  # jinja raises its own error types (raise_exception in templates)
            raise TemplateError(f"the chat template failed on these messages: {e}") from e
        return str(text)

    def encode(self, text: str) -> list[int]:
        if self._backend is not None and len(text) <= _ENCODE_INLINE_CHARS:
            # a short text: `encode` on this thread; encode_batch would wake its thread pool (rayon) for it
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        if self._backend is not None:  # encode_batch releases the GIL (encode does not): other threads run
            return list(self._backend.encode_batch([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (OpenAI logprobs `bytes`); exact for byte-level vocabularies."""
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = self._bytes_cache[token_id] = self._token_bytes(token_id)
        return cached

    def _token_bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        decoder = self._byte_decoder
        if (decoder is not None and token_id not in self._special_ids and isinstance(piece, str) and piece
                and all(c in decoder for c in piece)):
            return bytes(decoder[c] for c in piece)
        return self.decode([token_id]).encode("utf-8")

    def glue(self, output_ids: Sequence[int]) -> str:
        """Text between a served output and the messages that follow it (closes the assistant turn)."""
        if output_ids and output_ids[-1] in self._close_prefixes:
            return self._close_prefixes[output_ids[-1]]
        return self.convention.turn_close

    def render_tail(self, messages: Sequence[Message]) -> str:
        """The new messages of an extended conversation, rendered alone, with the generation prompt.

        They are rendered after a throw-away user turn, which is then cut off: templates write a
        conversation header before the first message (Llama 3: <|begin_of_text|> and a dated system
        turn; a system message at position 0 becomes the tools block), which a tail does not have.
        """
        anchor = [{"role": "user", "content": _PROBE_USER}]
        head = self._anchor_head
        if head is None:
            head = self._anchor_head = self.render(anchor, add_generation_prompt=False)
        full = self.render([*anchor, *messages])
        if not full.startswith(head):
            raise TemplateError("the chat template renders a user turn differently when messages follow it")
        return full[len(head) :]

    def tail_after_served(self, reply: Message, served: str, following: Sequence[Message]) -> str | None:
        """The messages `following` a served reply as the template renders them after it, if it renders the
        reply as history exactly as `served` (the reply's text as the model wrote it, then the glue); None if
        not: re-tokenizing the conversation would change the reply (tito's `realigned`), and the tail is then
        `render_tail`'s. One render serves both the check and the tail (a call rendered twice before): where
        the reply renders as served, the prompt's text is the template's own rendering of the conversation
        after the reply, which the probed convention makes equal to `render_tail`. A template that refuses
        the reply as history (Llama 3: one tool call per turn) does not render it as served; the call is
        still served, from its ids."""
        anchor = [{"role": "user", "content": _PROBE_USER}]
        head = self._anchor_prompt
        if head is None:
            head = self._anchor_prompt = self.render(anchor)
        try:
            full = self.render([*anchor, reply, *following])
        except TemplateError:
            return None
        start = head + served
        return full[len(start) :] if full.startswith(start) else None

    # ----- probe

    def _probe(self) -> TemplateConvention:
        """Derives turn_close and the generation prompt, and checks the split holds (see module doc)."""
        user = {"role": "user", "content": _PROBE_USER}
        nxt = {"role": "user", "content": _PROBE_NEXT}
        gen_prompt = self._strip_prefix(self.render([nxt]), self.render([nxt], add_generation_prompt=False),
                                        "the generation prompt is not appended at the end")
        reply = {"role": "assistant", "content": _PROBE_REPLY}
        head = self.render([{"role": "system", "content": _PROBE_SYSTEM}, user], add_generation_prompt=False)
        full = self.render([{"role": "system", "content": _PROBE_SYSTEM}, user, reply, nxt])
        tail = self.render_tail([nxt])
        turn = full[len(head) : len(full) - len(tail)]
        if not full.startswith(head) or not full.endswith(tail) or turn.count(_PROBE_REPLY) != 1:
            raise TemplateError(
                "the chat template does not render [system, user, assistant, user] as "
                "render([system, user]) + open + reply + close + render([user]): no token-in/token-out with it"
            )
        convention = TemplateConvention(turn.split(_PROBE_REPLY)[1], gen_prompt)
        self.convention = convention
        tool_reply = {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}
        tool_result = {"role": "tool", "tool_call_id": "call_probe", "content": "PROBE-RESULT"}
        cases: list[tuple[list[Message], Any, list[Message], list[Message]]] = [
            ([user], None, [reply], [nxt]),
            ([user], _PROBE_TOOLS, [tool_reply], [tool_result]),
            ([{"role": "system", "content": _PROBE_SYSTEM}, user], _PROBE_TOOLS, [tool_reply],
             [tool_result, {**tool_result, "content": "PROBE-RESULT-2"}]),
        ]
        mid_system: tuple[list[Message], Any, list[Message], list[Message]] = (
            [user], _PROBE_TOOLS, [reply], [{"role": "system", "content": _PROBE_SYSTEM}, nxt])
        try:
            self.render([*mid_system[0], *mid_system[2], *mid_system[3]], _PROBE_TOOLS)
            cases.append(mid_system)
        except TemplateError:
            pass  # the template refuses a system message after the first turn (Qwen3.5+): so will such requests
        for prompt, tools, replies, following in cases:
            head = self.render(prompt, tools, add_generation_prompt=False)
            full = self.render([*prompt, *replies, *following], tools)
            expected_tail = convention.turn_close + self.render_tail(following)
            if not (full.startswith(head) and full.endswith(expected_tail)):
                roles = [m["role"] for m in [*prompt, *replies, *following]]
                raise TemplateError(
                    f"the chat template does not split at the assistant turn for roles {roles} "
                    f"(tools={'yes' if tools else 'no'}): no token-in/token-out with it"
                )
        return convention

    def _takes_mapping_arguments(self) -> bool:
        """Whether the template renders a call only with its arguments as a mapping (it raises on, or does
        not write, the JSON string)."""
        conversation: list[Message] = [{"role": "user", "content": _PROBE_USER},
                                       {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}]
        try:
            as_string = self.render(conversation, _PROBE_TOOLS, add_generation_prompt=False)
        except TemplateError:
            as_string = ""
        if "probe_tool" in as_string and '"1"' in as_string:
            return False
        self.arguments_as_mapping = True
        try:
            as_mapping = self.render(conversation, _PROBE_TOOLS, add_generation_prompt=False)
        except TemplateError:
            return False
        return "probe_tool" in as_mapping

    def _tool_call_style(self) -> str:
        """How the template writes an assistant's tool call, hence how replies are parsed (`outputs`):
        "json" when the call is the bare `{"name": ..., "parameters": ...}` of Llama 3, else "hermes"."""
        rendered = self.render([{"role": "user", "content": _PROBE_USER},
                                {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}], _PROBE_TOOLS,
                               add_generation_prompt=False)
        return "json" if '{"name": "probe_tool", "parameters"' in rendered else "hermes"

    @staticmethod
    def _strip_prefix(text: str, prefix: str, problem: str) -> str:
        if not text.startswith(prefix):
            raise TemplateError(f"chat template: {problem}")
        return text[len(prefix) :]


def _with_mapping_arguments(message: Message) -> Message:
    """The message with its tool calls' JSON-string arguments parsed (left as they are if not JSON)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for call in calls:
        fn = call.get("function", call)
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):  # not JSON: the template gets the string
                fn = {**fn, "arguments": json.loads(arguments)}
        out.append({**call, "function": fn} if "function" in call else fn)
    return {**message, "tool_calls": out}


def _eos_ids(path: Path, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((path / name).read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids


def _byte_level_decoder(tokenizer: Any) -> dict[str, int] | None:
    """char -> byte map when the vocabulary is byte-level BPE (GPT-2 / Qwen style), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or "ByteLevel" not in type(getattr(backend, "decoder", None)).__name__ + repr(
        getattr(backend, "decoder", None)
    ):
        return None
    return {char: byte for byte, char in bytes_to_unicode().items()}
