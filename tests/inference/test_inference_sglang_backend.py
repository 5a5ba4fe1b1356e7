"""SGLang backend: the launch command, clean refusal without sglang/GPU, and (gpu) payload parity."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from bus.ports import free_port
from inference_svc.config import InferenceConfig
from inference_svc.sglang_backend import SGLangServer, launch_command, sglang_unavailable_reason, validate_with_sglang
from schemas.inference.client import generate_payload
from schemas.inference.errors import BackendUnavailableError

SGLANG_MISSING = importlib.util.find_spec("sglang") is None


@pytest.mark.unit
def test_launch_command_maps_the_config(tiny_model_dir: Path) -> None:
    config = InferenceConfig(
        model_path=tiny_model_dir, port=31000, max_context=100_000, weight_version=4,
        sglang_args=("--attention-backend", "triton"),
    )
    command = launch_command(config)
    assert command[1:3] == ["-m", "sglang.launch_server"]
    pairs = dict(zip(command[3::2], command[4::2], strict=False))
    assert pairs["--model-path"] == str(tiny_model_dir) and pairs["--port"] == "31000"
    assert pairs["--context-length"] == "1024"  # capped by the model's max_position_embeddings
    assert pairs["--weight-version"] == "4" and command[-2:] == ["--attention-backend", "triton"]


@pytest.mark.unit
def test_start_refuses_cleanly_without_sglang_or_gpu(tiny_model_dir: Path) -> None:
    reason = sglang_unavailable_reason()
    if reason is None:
        pytest.skip("sglang and a GPU are present: the refusal path does not apply")
    with pytest.raises(BackendUnavailableError, match=r"sglang|GPU"):
        SGLangServer(InferenceConfig(model_path=tiny_model_dir)).start()


@pytest.mark.gpu
@pytest.mark.skipif(SGLANG_MISSING, reason="sglang is not installed: cannot check payloads against its classes")
def test_our_generate_payloads_are_valid_sglang_requests() -> None:
    payloads = [
        generate_payload([1, 2, 3]),
        generate_payload([1, 2, 3], {"max_new_tokens": 16, "temperature": 0.0}, rid="a"),
        generate_payload([4], {"max_new_tokens": 8, "top_p": 0.9, "top_k": 20, "seed": 7, "ignore_eos": True}),
        generate_payload([5, 6], {"stop_token_ids": [258], "sampling_seed": 1}, return_logprob=False),
    ]
    for payload in payloads:
        validate_with_sglang(payload, vocab_size=266)


@pytest.mark.gpu
@pytest.mark.skipif(sglang_unavailable_reason() is not None, reason=str(sglang_unavailable_reason()))
def test_sglang_server_serves_the_default_model_through_our_client(
    tiny_model_dir: Path, perturbed_model_dir: Path, tmp_path: Path
) -> None:
    config = InferenceConfig(model_path=tiny_model_dir, port=free_port(), max_context=1024,
                             sglang_startup_timeout_s=600)
    with SGLangServer(config, log_path=tmp_path / "sglang.log") as server:

        async def scenario() -> None:
            async with server.client() as client:
                first = await client.generate([1, 2, 3], {"max_new_tokens": 8, "ignore_eos": True})
                assert len(first.output_ids) == 8 and len(first.token_logprobs()) == 8
                await client.pause("in_place")
                update = await client.update_weights_from_disk(perturbed_model_dir, 1)
                assert update.success
                await client.resume()
                after = await client.generate([1, 2, 3], {"max_new_tokens": 4})
                assert after.meta_info.weight_version == "1"

        asyncio.run(scenario())
