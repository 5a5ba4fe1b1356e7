"""The project's default model: a small random Qwen3 with a byte-level tokenizer and a ChatML template.

Nothing is downloaded: the tokenizer is built here with the `tokenizers` library (every UTF-8 byte is
one token, so any text round-trips and token ids are stable across machines), and the weights are a
seeded random init. `DefaultModelSpec.tokenizer="bpe"` gives it a byte-level BPE trained here instead
(`bpe_tokenizer`), "qwen3" / "qwen3_5" / "llama3" those checkpoints' real vocabularies (`vocabularies`:
built from the BPE ranks installed packages ship), and `chat_template` one of the formats real checkpoints
ship ("qwen3", "llama3", with their special tokens) instead of the project's compact ChatML.
`python -m inference_svc.default_model --out DIR` writes a normal Hugging Face directory that `AutoTokenizer` /
`AutoModelForCausalLM.from_pretrained(DIR)` load offline.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from inference_svc import bpe_tokenizer, vocabularies
from schemas.inference.byte_level import bytes_to_unicode

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
PAD = "<|pad|>"
TOOL_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END, PAD, *TOOL_MARKERS)
CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZERS = ("byte", "bpe", *vocabularies.VOCABULARIES)


@dataclass(frozen=True)
class TemplateFamily:
    """A chat format and the special tokens its template writes; `stop`: the tokens that end a reply."""

    file: str
    special_tokens: tuple[str, ...]
    eos: str
    stop: tuple[str, ...]
    bos: str | None = None


LLAMA3_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                         "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", PAD)
TEMPLATES = {
    "chatml": TemplateFamily(CHAT_TEMPLATE_FILE, SPECIAL_TOKENS, IM_END, (IM_END, END_OF_TEXT)),
    "qwen3": TemplateFamily("chat_template_qwen3.jinja", SPECIAL_TOKENS, IM_END, (IM_END, END_OF_TEXT)),
    "llama3": TemplateFamily("chat_template_llama3.jinja", LLAMA3_SPECIAL_TOKENS, "<|eot_id|>",
                             ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"), bos="<|begin_of_text|>"),
}


@dataclass(frozen=True)
class DefaultModelSpec:
    """Shape of the default model; the defaults give ~0.8M parameters."""

    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 32_768  # stock agent prompts: smolagents' CodeAgent system prompt is ~8.7K
    initializer_range: float = 0.05
    seed: int = 0
    vocab_size: int = 0  # embedding rows; 0: the tokenizer's size. Real checkpoints pad theirs (Qwen3: 151,936
    # rows for 151,669 tokens): a larger value gives the model a real model's output width (bench/gpu_smoke.py)
    tokenizer: str = "byte"  # "byte": one token per UTF-8 byte; "bpe": a byte-level BPE trained at creation;
    # "qwen3" (151,669 tokens), "qwen3_5" (Qwen3.5/3.6: 248,077) or "llama3" (Llama 3.1: 128,256): the real
    # vocabularies (`vocabularies`), with the formats whose special tokens they hold
    chat_template: str = "chatml"  # "chatml" (the project's), "qwen3" or "llama3" (those checkpoints' formats)
    bpe_vocab_size: int = 4096  # tokens of the "bpe" tokenizer, the 256 bytes included, special tokens not

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer={self.tokenizer!r}: expected one of {list(TOKENIZERS)}")
        if self.chat_template not in TEMPLATES:
            raise ValueError(f"chat_template={self.chat_template!r}: expected one of {sorted(TEMPLATES)}")
        vocabulary = vocabularies.VOCABULARIES.get(self.tokenizer)
        if vocabulary is not None and self.chat_template not in vocabulary.families:
            raise ValueError(f"chat_template={self.chat_template!r}: the {self.tokenizer} vocabulary has the special "
                             f"tokens of {list(vocabulary.families)} only")
        if self.bpe_vocab_size <= 256:
            raise ValueError(f"bpe_vocab_size={self.bpe_vocab_size}: must be above the 256 byte tokens")


def chat_template(name: str = "chatml") -> str:
    """A chat template shipped in this package (`TEMPLATES`)."""
    return resources.files("inference_svc").joinpath(TEMPLATES[name].file).read_text(encoding="utf-8")


def build_tokenizer(kind: str = "byte", template: str = "chatml", bpe_vocab_size: int = 4096) -> Any:
    """The model's tokenizer (a PreTrainedTokenizerFast): ids 0..255 are bytes, then the BPE merges
    (`kind="bpe"`), then the template's special tokens; or a real vocabulary (`vocabularies.VOCABULARIES`),
    with its own added tokens and ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    family = TEMPLATES[template]
    vocabulary = vocabularies.VOCABULARIES.get(kind)
    if vocabulary is not None:
        backend = vocabularies.backend(kind)
        missing = [token for token in family.special_tokens if token != PAD and backend.token_to_id(token) is None]
        if missing:
            raise ValueError(f"chat_template={template!r}: tokens {missing} are not in the {kind} vocabulary")
        specials = [t.content for t in backend.get_added_tokens_decoder().values() if t.special]
        return _wrap(backend, family, template, vocabulary.pad, specials)
    if kind == "byte":
        backend = Tokenizer(models.BPE(vocab={char: byte for byte, char in bytes_to_unicode().items()}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
    else:
        backend = bpe_tokenizer.bpe_backend(_bpe_merges(template, bpe_vocab_size))
    backend.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in family.special_tokens])
    return _wrap(backend, family, template, PAD, family.special_tokens)


@cache
def _bpe_merges(template: str, bpe_vocab_size: int) -> tuple[tuple[str, str], ...]:
    """Trained once per process (~1 s, most of it rendering the corpus): a test session makes many models."""
    byte_level = build_tokenizer("byte", template)
    texts = bpe_tokenizer.corpus(
        lambda messages, tools: str(byte_level.apply_chat_template(messages, tools=tools, tokenize=False)),
        TEMPLATES[template].special_tokens)
    return tuple(bpe_tokenizer.train_merges(texts, bpe_vocab_size))


def _wrap(backend: Any, family: TemplateFamily, template: str, pad: str, specials: Sequence[str]) -> Any:
    """The backend as a PreTrainedTokenizerFast with the template's eos/bos, `pad`, and `specials` named."""
    from transformers import PreTrainedTokenizerFast

    named = {family.eos, pad, *([family.bos] if family.bos else [])}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=family.eos,
        pad_token=pad,
        **({"bos_token": family.bos} if family.bos else {}),
        additional_special_tokens=[t for t in specials if t not in named],
        clean_up_tokenization_spaces=False,
        model_max_length=DefaultModelSpec.max_position_embeddings,
    )
    tokenizer.chat_template = chat_template(template)
    return tokenizer


def create_default_model(out_dir: Path, spec: DefaultModelSpec | None = None) -> Path:
    """Write the default model (config, safetensors, tokenizer, generation config) to `out_dir`."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    spec = spec or DefaultModelSpec()
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.tokenizer, spec.chat_template, spec.bpe_vocab_size)
    eos_ids = [tokenizer.convert_tokens_to_ids(token) for token in TEMPLATES[spec.chat_template].stop]
    if 0 < spec.vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size={spec.vocab_size} is below the tokenizer's {len(tokenizer)} tokens")
    config = Qwen3Config(
        vocab_size=spec.vocab_size or len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_ids[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(spec.seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0, top_p=1.0
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    _add_legacy_keys(out_dir)
    (out_dir / "seamlessflow_model.json").write_text(json.dumps({"spec": asdict(spec)}, indent=2) + "\n")
    return out_dir


def _add_legacy_keys(out_dir: Path) -> None:
    """Makes the directory readable by transformers 4.x too (what SGLang may pin on a GPU machine).

    transformers 5 writes `rope_parameters` and `dtype` only, and a tokenizer class 4.x does not know;
    a 4.x reader would fall back to Qwen3's default rope_theta (1e6) and compute a different model.
    """
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    tok_path = out_dir / "tokenizer_config.json"
    tok_config = json.loads(tok_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = tok_config.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        tok_config["additional_special_tokens"] = extra
    tok_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")


def write_perturbed_checkpoint(src_dir: Path, out_dir: Path, noise_std: float = 0.02, seed: int = 1) -> Path:
    """Copy a model directory with Gaussian noise added to every weight: a stand-in for a trainer step.

    Used by tests and benchmarks to exercise weight hot-swaps without running the trainer.
    """
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    for path in src_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, out_dir / path.name)
    for shard in sorted(src_dir.glob("*.safetensors")):
        tensors = load_file(str(shard))
        noisy = {
            name: (t + noise_std * torch.randn(t.shape, generator=generator, dtype=torch.float32).to(t.dtype))
            if t.is_floating_point()
            else t
            for name, t in tensors.items()
        }
        save_file({k: v.contiguous() for k, v in noisy.items()}, str(out_dir / shard.name), metadata={"format": "pt"})
    return out_dir


def _parse_args(argv: list[str] | None) -> tuple[Path, DefaultModelSpec]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="directory to write (created if missing)")
    defaults = DefaultModelSpec()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    spec = DefaultModelSpec(**{name: getattr(args, name) for name in asdict(defaults)})
    return args.out, spec


def main(argv: list[str] | None = None) -> None:
    out_dir, spec = _parse_args(argv)
    create_default_model(out_dir, spec)
    from safetensors.torch import load_file

    n_params = sum(t.numel() for t in load_file(str(out_dir / "model.safetensors")).values())
    print(f"default model written to {out_dir} ({n_params / 1e6:.2f}M parameters)")


if __name__ == "__main__":
    main()
