"""`model.path`: any local Hugging Face causal-LM directory of a supported architecture is a run's model.

Two directories are made here as a user would have them, with transformers alone (`Qwen3Config` /
`LlamaConfig`, random init, `save_pretrained`) and a tokenizer of the matching chat-template family: the
native engine loads each and its greedy outputs equal transformers'; the capture proxy's codec reads its
tokenizer and chat template; the run config takes it (and refuses what cannot be served, naming the field);
`prepare_model` copies it as the run's model, or warms it up on top (keyed by the directory's content); the
trainer trains it, writing its checkpoint with its own writer, and `sflow export` turns that into a directory
transformers loads with the engine's greedy outputs.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agents_adapter.proxy.chat_codec import ChatCodec
from inference_svc.default_model import TEMPLATES, build_tokenizer
from inference_svc.engine import NativeEngine
from infra import run_inputs, stack
from infra.errors import InfraError
from infra.export import export_policy
from infra.run_inputs import RunPaths, prepare_model, warmup_cache_key
from schemas.inference.types import SamplingOptions
from tests.unit.infra.run_configs import load
from tests.unit.trainer.trainer_helpers import random_batch, trainer_config

pytestmark = pytest.mark.unit
SIZES: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                         "max_position_embeddings": 1024}


def _hf_directory(out: Path, architecture: str) -> Path:
    """A tiny random model of `architecture` ("qwen3" or "llama") saved by transformers, with its family's
    chat template and stop tokens."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    template = "qwen3" if architecture == "qwen3" else "llama3"
    tokenizer = build_tokenizer("byte", template)
    stops = [tokenizer.convert_tokens_to_ids(t) for t in TEMPLATES[template].stop]
    config_class, model_class = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[
        architecture]
    config = config_class(vocab_size=len(tokenizer), eos_token_id=stops[0], pad_token_id=tokenizer.pad_token_id,
                          tie_word_embeddings=False, **SIZES)
    torch.manual_seed(0)
    model = model_class(config)
    model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def hf_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield _hf_directory(tmp_path_factory.mktemp(request.param) / "model", request.param)
    torch.set_num_threads(before)


def test_the_engine_serves_it_with_transformers_greedy_outputs(hf_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
    prompt = list(tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False))
    with NativeEngine(hf_dir, max_running_requests=2, max_context=1024) as engine:
        assert engine.model_type == model.config.model_type
        served = engine.generate(prompt, SamplingOptions(max_new_tokens=10, temperature=0.0, ignore_eos=True),
                                 timeout_s=60).output_ids
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(10):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    assert served == tokens[len(prompt):]


def test_the_proxy_codec_reads_its_tokenizer_and_chat_template(hf_dir: Path) -> None:
    from transformers import AutoTokenizer

    codec = ChatCodec.from_model_dir(hf_dir)
    messages = [{"role": "user", "content": "hello"}]
    expected = AutoTokenizer.from_pretrained(str(hf_dir)).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    assert codec.render(messages) == expected
    assert codec.decode(codec.encode(expected)) == expected


def test_a_run_takes_it_and_prepare_model_copies_it(hf_dir: Path, tmp_path: Path) -> None:
    config = load(tmp_path, model={"path": str(hf_dir), "warmup_steps": 0})
    assert config.model.path == hf_dir
    model = prepare_model(config, RunPaths(tmp_path / "run"))
    assert model == tmp_path / "run" / "model"
    assert (model / "model.safetensors").read_bytes() == (hf_dir / "model.safetensors").read_bytes()
    assert (model / "tokenizer_config.json").read_text() == (hf_dir / "tokenizer_config.json").read_text()


def test_prepare_model_warms_it_up_on_top(hf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack, "VAR_DIR", tmp_path / "var")
    config = load(tmp_path, model={"path": str(hf_dir), "warmup_steps": 2, "warmup_tasks": 8})
    model = prepare_model(config, RunPaths(tmp_path / "run"))
    assert (model / "config.json").is_file()
    assert (model / "model.safetensors").read_bytes() != (hf_dir / "model.safetensors").read_bytes()
    assert (tmp_path / "var" / "cache" / f"warm-{warmup_cache_key(config)}").is_dir()
    assert not list((tmp_path / "var" / "cache").glob("base-*"))  # no default model was made


def test_the_cache_key_follows_the_directorys_content_not_its_place(hf_dir: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(hf_dir, tmp_path / "elsewhere")
    key = warmup_cache_key(load(tmp_path, model={"path": str(hf_dir)}))
    assert warmup_cache_key(load(tmp_path, model={"path": str(copy)})) == key
    (copy / "generation_config.json").write_text("{}")
    assert warmup_cache_key(load(tmp_path, model={"path": str(copy)})) != key
    assert run_inputs.warmup_cache_key(load(tmp_path, model={})) != key


def test_what_cannot_be_served_is_refused_naming_the_field(hf_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(InfraError, match=r"model.path='.*nowhere' is not a directory"):
        load(tmp_path, model={"path": str(tmp_path / "nowhere")})
    with pytest.raises(InfraError, match=r"given with \['chat_template'\], which describe the default model"):
        load(tmp_path, model={"path": str(hf_dir), "chat_template": "llama3"})
    broken = shutil.copytree(hf_dir, tmp_path / "gpt2")
    (broken / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(InfraError, match=r"model_type='gpt2'; supported: \['qwen3', 'qwen2', 'llama', 'mistral'\]"):
        load(tmp_path, model={"path": str(broken)})
    no_weights = shutil.copytree(hf_dir, tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(InfraError, match=r"holds no \*.safetensors weights"):
        load(tmp_path, model={"path": str(no_weights)})


def test_the_trainer_trains_a_llama_and_its_checkpoint_exports(tmp_path: Path) -> None:
    """Llama only: the trainer's own tests train the default model, a Qwen3 (DeepSpeed's set-up takes ~25 s)."""
    from transformers import AutoModelForCausalLM

    from trainer_svc.trainer import Trainer

    hf_dir = _hf_directory(tmp_path / "llama", "llama")

    run = RunPaths(tmp_path / "runs" / "r")
    prepare_model(load(tmp_path, model={"path": str(hf_dir), "warmup_steps": 0}), run)
    trainer = Trainer(trainer_config(run.model, micro_batch_tokens=32))
    trainer.train_step(random_batch(seed=1), 0)
    trainer.save_checkpoint(run.weights / "r" / "v000001")  # the trainer's own writer, as the service names it
    written = export_policy(run.root, tmp_path / "exported")
    assert written.version == 1
    model = AutoModelForCausalLM.from_pretrained(str(written.out_dir)).eval()
    assert model.config.model_type == "llama"
    prompt = [5, 17, 42, 99, 3]
    with NativeEngine(written.out_dir, max_running_requests=2, max_context=1024) as engine:
        served = engine.generate(prompt, SamplingOptions(max_new_tokens=8, temperature=0.0, ignore_eos=True),
                                 timeout_s=60).output_ids
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                             do_sample=False, max_new_tokens=8, min_new_tokens=8, eos_token_id=None, pad_token_id=0)
    assert out[0, 5:].tolist() == served
