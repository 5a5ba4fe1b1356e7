"""A model directory's tokenizer and chat template, loaded without transformers' tokenizer classes.

Why: in transformers 5 every tokenizer class imports torch when torch is installed (through its GGUF
loader), and torch cost the capture proxy ~600 MB of RSS for a tokenizer it only uses to encode,
decode and render the chat template. `TokenizerFiles` loads `tokenizer.json` with `tokenizers` and
renders the template compiled by transformers' own renderer (`_compile_jinja_template`: its sandboxed
jinja environment, filters and `{% generation %}` tag; it imports no torch), with the same variables
`apply_chat_template` passes, so prompts are those transformers gives. The compiled template (transformers
caches it per source) is rendered directly: `render_jinja_template` around it cost ~25 us of every render.
It offers the part of the tokenizer interface `ChatCodec` uses. A model without a
`tokenizer.json` (a slow, sentencepiece-only tokenizer) is still loaded through `AutoTokenizer`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agents_adapter.errors import TemplateError

# The named special tokens whose text `apply_chat_template` hands to the template (`special_tokens_map`).
_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TokenizerFiles:
    """`tokenizer.json` + `tokenizer_config.json` + the chat template, as `ChatCodec` reads a tokenizer."""

    def __init__(self, backend: Any, chat_template: str | Mapping[str, str] | None,
                 special_tokens_map: Mapping[str, str], extra_special_tokens: Sequence[str] = ()) -> None:
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self.special_tokens_map = dict(special_tokens_map)
        eos = self.special_tokens_map.get("eos_token")
        self.eos_token_id = backend.token_to_id(eos) if eos is not None else None
        special = [*self.special_tokens_map.values(), *extra_special_tokens]
        special_ids = {backend.token_to_id(token) for token in special}
        special_ids |= {i for i, added in backend.get_added_tokens_decoder().items() if added.special}
        self.all_special_ids = sorted(i for i in special_ids if i is not None)

    @classmethod
    def from_model_dir(cls, path: Path) -> TokenizerFiles:
        from tokenizers import Tokenizer

        try:
            backend = Tokenizer.from_file(str(path / "tokenizer.json"))
            config = _json_file(path / "tokenizer_config.json")
        except Exception as e:  # tokenizers raises a bare Exception; json a ValueError; files an OSError
            raise TemplateError(f"model_path={str(path)!r}: cannot load its tokenizer: {e}") from e
        named = {name: token for name in _NAMED_SPECIAL if (token := _token_text(config.get(name))) is not None}
        extra = [t for t in map(_token_text, config.get("additional_special_tokens")
                                or config.get("extra_special_tokens") or ()) if t is not None]
        return cls(backend, _chat_template(path, config), named, extra)

    def __len__(self) -> int:
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=True))

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        token: str | None = self.backend_tokenizer.id_to_token(token_id)
        return token

    def apply_chat_template(self, conversation: Sequence[Mapping[str, Any]],
                            tools: Sequence[Mapping[str, Any]] | None = None, *, add_generation_prompt: bool = False,
                            tokenize: bool = False) -> str:
        """The template rendered as transformers renders it (text only: `tokenize` must be False)."""
        if tokenize:
            raise ValueError("TokenizerFiles renders text only (tokenize=False)")
        return str(self._compiled(tools).render(
            messages=conversation, tools=tools or None, documents=None, add_generation_prompt=add_generation_prompt,
            **self.special_tokens_map,
        ))

    def _compiled(self, tools: Sequence[Mapping[str, Any]] | None) -> Any:
        from transformers.utils.chat_template_utils import _compile_jinja_template  # lru-cached per source

        return _compile_jinja_template(self._template(tools))

    def _template(self, tools: Sequence[Mapping[str, Any]] | None) -> str:
        """The template, or of named templates the one transformers picks (`tool_use` with tools)."""
        template = self.chat_template
        if isinstance(template, str):
            return template
        if not template:
            raise TemplateError("the tokenizer has no chat template")
        if tools and "tool_use" in template:
            return template["tool_use"]
        if "default" in template:
            return template["default"]
        raise TemplateError(f"the tokenizer's chat templates {sorted(template)} have none named 'default'")


def _json_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or an AddedToken's dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _chat_template(path: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
    """Where transformers looks: chat_template.jinja, chat_template.json, then tokenizer_config.json."""
    jinja = path / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    template = _json_file(path / "chat_template.json").get("chat_template", config.get("chat_template"))
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        return {str(t["name"]): str(t["template"]) for t in template}
    return template if isinstance(template, str) else None
