"""The HTTP app: SGLang-shaped responses, and clear 4xx bodies for bad input while the engine keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from inference_svc.app import create_app
from inference_svc.config import InferenceConfig

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    config = InferenceConfig(model_path=tiny_model_dir, max_context=512, max_running_requests=8, port=0)
    with TestClient(create_app(config)) as test_client:
        yield test_client


def generate_ok(client: TestClient) -> dict[str, Any]:
    response = client.post(
        "/generate",
        json={
            "input_ids": [1, 2, 3],
            "sampling_params": {"max_new_tokens": 4, "sampling_seed": 1},
            "return_logprob": True,
        },
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_generate_has_sglang_shape_and_per_token_versions(client: TestClient) -> None:
    body = generate_ok(client)
    meta = body["meta_info"]
    assert len(body["output_ids"]) == 4 and isinstance(body["text"], str)
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 4 and meta["weight_version"] == "0"
    assert [entry[1] for entry in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(entry[0] <= 0 and entry[2] is None for entry in meta["output_token_logprobs"])
    assert meta["output_token_versions"] == [0, 0, 0, 0]
    assert generate_ok(client)["output_ids"] == body["output_ids"]  # same sampling_seed, same tokens


def test_text_prompt_stream_and_info_endpoints(client: TestClient) -> None:
    response = client.post(
        "/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 5}, "stream": True}
    )
    assert response.status_code == 200
    events = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    assert chunks[-1]["meta_info"]["prompt_tokens"] == 5
    assert [len(c["output_ids"]) for c in chunks] == sorted(len(c["output_ids"]) for c in chunks)
    assert client.get("/health_generate").status_code == 200
    assert client.get("/get_weight_version").json() == {"weight_version": "0"}
    info = client.get("/get_model_info").json()
    assert info["model_type"] == "qwen3" and info["context_length"] == 512 and info["vocab_size"] == 266
    assert client.post("/flush_cache").status_code == 200


BAD_GENERATE_BODIES = [
    pytest.param({"input_ids": [1, 266]}, "input_ids[1]=266", id="token-id-beyond-vocab"),
    pytest.param({"input_ids": []}, "empty", id="empty-input"),
    pytest.param({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 600}}, "context length", id="context"),
    pytest.param({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature", id="negative-temp"),
    pytest.param({"input_ids": [1], "sampling_params": {"top_p": 1.5}}, "top_p", id="top-p"),
    pytest.param({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k", id="top-k"),
    pytest.param({"input_ids": [1], "max_tokens": 3}, "max_tokens", id="unknown-field"),
    pytest.param({"input_ids": [1], "sampling_params": {"temprature": 0.5}}, "temprature", id="unknown-sampling"),
    pytest.param({"input_ids": ["a"]}, "input_ids", id="string-token"),
    pytest.param({"input_ids": [[1, 2]]}, "input_ids", id="batched-input"),
    pytest.param({}, "exactly one of input_ids or text", id="no-prompt"),
    pytest.param({"input_ids": [1], "sampling_params": {"n": 2}}, "n", id="n-samples"),
    pytest.param({"input_ids": [1], "logprob_start_len": 0}, "logprob_start_len", id="prompt-logprobs"),
]


@pytest.mark.parametrize(("body", "fragment"), BAD_GENERATE_BODIES)
def test_bad_generate_requests_get_400_and_the_engine_keeps_serving(
    client: TestClient, body: dict[str, Any], fragment: str
) -> None:
    response = client.post("/generate", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert fragment in error["message"]
    generate_ok(client)


def test_malformed_json_and_unknown_routes(client: TestClient) -> None:
    response = client.post("/generate", content=b'{"input_ids": [1,', headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("malformed JSON body")
    missing = client.get("/no_such_endpoint")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
    assert client.post("/pause_generation", json={"mode": "sleep"}).status_code == 400
    generate_ok(client)


def test_bad_weight_path_keeps_old_weights_live(client: TestClient, tmp_path: Path) -> None:
    before = generate_ok(client)
    response = client.post(
        "/update_weights_from_disk", json={"model_path": str(tmp_path / "missing"), "weight_version": "3"}
    )
    assert response.status_code == 400
    body = response.json()
    assert body["error"]["type"] == "weight_load_error" and body["success"] is False
    assert "does not exist" in body["error"]["message"]
    bad_version = client.post("/update_weights_from_disk", json={"model_path": str(tmp_path), "weight_version": "v2"})
    assert bad_version.status_code == 400 and "weight_version" in bad_version.json()["error"]["message"]
    assert client.get("/get_weight_version").json() == {"weight_version": "0"}
    assert generate_ok(client)["output_ids"] == before["output_ids"]


def test_update_weights_pause_and_abort_endpoints(tiny_model_dir: Path, perturbed_model_dir: Path) -> None:
    config = InferenceConfig(model_path=tiny_model_dir, max_context=256, port=0, weights_root=perturbed_model_dir)
    with TestClient(create_app(config)) as fresh:
        paused = fresh.post("/pause_generation", json={"mode": "in_place"})
        assert paused.status_code == 200 and paused.json()["status"] == "ok"
        update = fresh.post(
            "/update_weights_from_disk", json={"model_path": str(perturbed_model_dir), "weight_version": "7"}
        )
        assert update.status_code == 200
        assert update.json()["success"] is True and update.json()["weight_version"] == "7"
        assert fresh.post("/continue_generation", json={}).status_code == 200
        body = generate_ok(fresh)
        assert body["meta_info"]["output_token_versions"] == [7] * 4 and body["meta_info"]["weight_version"] == "7"
        assert fresh.post("/abort_request", json={"rid": "nobody"}).json() == {"num_aborted": 0}
        assert fresh.post("/abort_request", json={"abort_all": True}).json() == {"num_aborted": 0}
