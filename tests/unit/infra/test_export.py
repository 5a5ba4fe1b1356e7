"""`sflow export`: a trained version of a run becomes a Hugging Face directory that transformers loads with
the engine's greedy outputs, token for token; a missing run or version, a corrupt or incomplete checkpoint
and an occupied output directory are refused with the bad value named.

The run folder is laid out as a run leaves it (`runs/<run>/model` the base, `weights/<run_id>/v<version>`
the trainer's checkpoints): a trainer step is stood in for by perturbing the weights
(`write_perturbed_checkpoint`), its state written by the trainer's own `checkpoint.write_progress`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from inference_svc.default_model import create_default_model, write_perturbed_checkpoint
from inference_svc.engine import NativeEngine
from infra.cli import app
from infra.export import PROVENANCE_FILE, ExportError, export_policy
from schemas.inference.types import SamplingOptions
from tests.factories import TINY_SPEC
from trainer_svc import checkpoint as ckpt

pytestmark = pytest.mark.unit
MAX_NEW_TOKENS = 12
PROMPTS = [
    [{"role": "user", "content": f"What is {a} + {3 * a + 1}?"}] if a % 2 else
    [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": f"Add {a} and {a * a}."}]
    for a in range(32)
]


def _checkpoint(run_root: Path, version: int, seed: int) -> Path:
    """A version as the trainer commits it: model files, tokenizer files, engine state, trainer state."""
    directory = write_perturbed_checkpoint(run_root / "model", run_root / "weights" / "run" / f"v{version:06d}",
                                           noise_std=0.05, seed=seed)
    (directory / ckpt.ENGINE_STATE_DIR).mkdir()
    (directory / ckpt.ENGINE_STATE_DIR / "optimizer.pt").write_bytes(b"optimizer state")
    ckpt.write_progress(directory, ckpt.TrainerProgress(step=version, version=version,
                                                        weights_sha256=ckpt.weights_sha256(directory)))
    return directory


@pytest.fixture(scope="module")
def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs") / "demo-20260101-120000"
    create_default_model(root / "model", TINY_SPEC)
    _checkpoint(root, 1, seed=1)
    _checkpoint(root, 2, seed=2)
    return root


@pytest.fixture(scope="module")
def exported(run_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "policy"
    result = CliRunner().invoke(app, ["export", "--run", str(run_root), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_export_writes_the_newest_version_as_a_model_directory(run_root: Path, exported: Path) -> None:
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", PROVENANCE_FILE} <= names
    assert ckpt.ENGINE_STATE_DIR not in names and ckpt.PROGRESS_FILE not in names
    provenance = json.loads((exported / PROVENANCE_FILE).read_text())
    newest = run_root / "weights" / "run" / "v000002"
    assert provenance["version"] == 2 and provenance["weights_sha256"] == ckpt.read_progress(newest).weights_sha256
    assert (exported / "model.safetensors").read_bytes() == (newest / "model.safetensors").read_bytes()


def test_transformers_greedy_equals_the_engine_on_32_prompts(exported: Path, run_root: Path, one_thread: None) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(exported))
    model = AutoModelForCausalLM.from_pretrained(str(exported)).eval()
    assert tokenizer.chat_template  # the exported template renders the prompts
    prompts = [list(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))
               for m in PROMPTS]
    assert len(prompts) == 32 and len({tuple(p) for p in prompts}) == 32
    greedy = SamplingOptions(max_new_tokens=MAX_NEW_TOKENS, temperature=0.0)
    with NativeEngine(run_root / "weights" / "run" / "v000002", max_running_requests=32, max_context=1024) as engine:
        futures = [engine.submit(p, greedy) for p in prompts]
        served = [f.result(timeout=120).output_ids for f in futures]
        eos = sorted(engine.eos_token_ids)
    assert len({tuple(ids) for ids in served}) > 4 and sum(map(len, served)) > 16 * MAX_NEW_TOKENS  # not trivial
    for prompt, engine_ids in zip(prompts, served, strict=True):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=eos,
                                 pad_token_id=tokenizer.pad_token_id)
        assert out[0, len(prompt):].tolist() == engine_ids, tokenizer.decode(prompt)


def test_an_older_version_is_exported_on_request(run_root: Path, tmp_path: Path) -> None:
    written = export_policy(run_root, tmp_path / "v1", version=1)
    assert written.version == 1
    assert written.sha256 == ckpt.read_progress(run_root / "weights" / "run" / "v000001").weights_sha256


def test_refusals_name_the_bad_value(run_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"--version 7: .*no such version .*\[1, 2\]"):
        export_policy(run_root, tmp_path / "a", version=7)
    with pytest.raises(ExportError, match="no such run folder"):
        export_policy(tmp_path / "nowhere", tmp_path / "b")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ExportError, match=r"--out .*full.* not an empty directory"):
        export_policy(run_root, tmp_path / "full")
    empty_run = tmp_path / "empty-run"
    (empty_run / "weights" / "run" / ".v000001.tmp-0000").mkdir(parents=True)  # a crashed, uncommitted write
    with pytest.raises(ExportError, match="has no trained version"):
        export_policy(empty_run, tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


def test_a_corrupt_or_incomplete_checkpoint_is_refused(run_root: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(run_root, run)
    weights = run / "weights" / "run" / "v000002" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ExportError, match=r"v000002 is corrupt: .* hash to sha256=[0-9a-f]{64}, the trainer recorded"):
        export_policy(run, tmp_path / "out")
    (run / "weights" / "run" / "v000001" / "config.json").unlink()
    with pytest.raises(ExportError, match=r"v000001.* is missing \['config.json'\]"):
        export_policy(run, tmp_path / "out", version=1)
    assert not (tmp_path / "out").exists()


def test_the_command_resolves_a_run_name_and_exits_2_on_a_refusal(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["export", "--run", "no-such-run-anywhere", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "no run 'no-such-run-anywhere'" in result.output
