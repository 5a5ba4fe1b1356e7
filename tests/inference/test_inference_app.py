"""The HTTP app: SGLang-shaped responses, and clear 4xx bodies for bad input while the engine keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError

from inference_svc.app import create_app
from inference_svc.config import InferenceConfig
from inference_svc.weights import checkpoint_sha256

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
    pytest.param({"input_ids": [1, 266], "stream": True}, "input_ids[1]=266", id="streamed-bad-token"),
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


def test_bad_weight_path_keeps_old_weights_live(client: TestClient, tmp_path: Path, tiny_model_dir: Path) -> None:
    before = generate_ok(client)
    response = client.post(  # inside the weights roots (the start-up model directory), but missing
        "/update_weights_from_disk", json={"model_path": str(tiny_model_dir / "missing"), "weight_version": "3"}
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


# ----- hardening: every hostile input is a 4xx naming the problem, and the engine keeps serving -----------


def post_raw(client: TestClient, body: bytes, path: str = "/generate") -> Any:
    return client.post(path, content=body, headers={"content-type": "application/json"})


def assert_refused(response: Any, status: int, fragment: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and fragment in error["message"], error


def test_a_temperature_below_the_floor_is_greedy_with_finite_logprobs(client: TestClient) -> None:
    tiny = client.post("/generate", json={
        "input_ids": [1, 2, 3], "sampling_params": {"temperature": 1e-39, "max_new_tokens": 6}, "return_logprob": True,
    })
    assert tiny.status_code == 200, tiny.text
    greedy = client.post("/generate", json={
        "input_ids": [1, 2, 3], "sampling_params": {"temperature": 0, "max_new_tokens": 6}, "return_logprob": True,
    }).json()
    assert tiny.json()["output_ids"] == greedy["output_ids"]
    assert [entry[0] for entry in tiny.json()["meta_info"]["output_token_logprobs"]] == [0.0] * 6


def test_an_oversize_token_id_is_a_400(client: TestClient) -> None:
    assert_refused(client.post("/generate", json={"input_ids": [2**63]}), 400, "input_ids[0]=9223372036854775808")
    assert_refused(client.post("/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 2**63}}),
                   400, "max_new_tokens")
    generate_ok(client)


def test_deep_json_nesting_is_a_400(client: TestClient) -> None:
    deep = b'{"input_ids": [1], "rid": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert_refused(post_raw(client, deep), 400, "nests deeper than max_json_depth=32")
    generate_ok(client)


def test_lone_surrogates_are_a_400_wherever_they_are(client: TestClient) -> None:
    assert_refused(post_raw(client, b'{"text": "\\ud800"}'), 400, "body.text: lone surrogate '\\ud800'")
    assert_refused(post_raw(client, b'{"input_ids": [1], "rid": "a\\udfff"}'), 400, "body.rid")
    assert_refused(post_raw(client, b'{"input_ids": [1], "\\ud800": 1}'), 400, "a key in body")
    generate_ok(client)


def test_invalid_utf8_is_a_400(client: TestClient) -> None:
    assert_refused(post_raw(client, b'{"text": "\xff\xfe"}'), 400, "not valid UTF-8: byte 0xff at offset 10")
    generate_ok(client)


def test_an_oversize_body_is_a_413(client: TestClient) -> None:
    assert_refused(post_raw(client, b'{"text": "' + b"a" * (9 << 20) + b'"}'), 413, "max_body_bytes=8388608")
    generate_ok(client)


def test_an_unusable_weights_path_is_a_4xx(client: TestClient, tiny_model_dir: Path) -> None:
    for path in (f"{tiny_model_dir}/a\x00b", f"{tiny_model_dir}/" + "x" * 5000):
        response = client.post("/update_weights_from_disk", json={"model_path": path})
        assert_refused(response, 400, "cannot be resolved")
        assert response.json()["error"]["type"] == "weight_load_error"
    outside = client.post("/update_weights_from_disk", json={"model_path": "/tmp/" + "x" * 5000})
    assert_refused(outside, 403, "outside the weights roots")
    too_new = client.post("/update_weights_from_disk", json={"model_path": "/tmp", "weight_version": str(2**63)})
    assert_refused(too_new, 400, "2**63")
    generate_ok(client)


def test_5xx_bodies_carry_an_error_id_not_the_exception(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = client.app.state.engine  # type: ignore[attr-defined]

    def broken_stats() -> None:
        raise RuntimeError("secret /internal/path at line 42")

    monkeypatch.setattr(engine, "stats", broken_stats)
    raw = TestClient(client.app, raise_server_exceptions=False)
    response = raw.get("/engine_stats")
    assert response.status_code == 500
    message = response.json()["error"]["message"]
    assert "secret" not in response.text and "RuntimeError" not in response.text
    assert message.startswith("internal error (id ")
    monkeypatch.undo()
    generate_ok(client)


def test_weights_load_only_from_the_weights_root(
    tiny_model_dir: Path, perturbed_model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "weights"
    (root / "v1").mkdir(parents=True)
    for file in perturbed_model_dir.iterdir():
        (root / "v1" / file.name).write_bytes(file.read_bytes())
    (root / "escape").symlink_to(perturbed_model_dir, target_is_directory=True)
    (root / "v2").mkdir()
    (root / "v2" / "model.safetensors").symlink_to(perturbed_model_dir / "model.safetensors")
    config = InferenceConfig(model_path=tiny_model_dir, max_context=256, port=0, weights_root=root)
    with TestClient(create_app(config)) as fresh:
        for refused in (str(perturbed_model_dir), f"{root}/../../{perturbed_model_dir.name}", str(root / "escape"),
                        str(root / "v2")):
            response = fresh.post("/update_weights_from_disk", json={"model_path": refused, "weight_version": "1"})
            assert response.status_code == 403, (refused, response.text)
            error = response.json()["error"]
            assert error["type"] == "weights_path_forbidden" and "outside the weights roots" in error["message"]
            assert str(root) in error["message"]
        digest = checkpoint_sha256(root / "v1")
        wrong = fresh.post("/update_weights_from_disk",
                           json={"model_path": str(root / "v1"), "weight_version": "1", "sha256": "0" * 64})
        assert wrong.status_code == 400 and "expected '0000" in wrong.json()["error"]["message"]
        assert fresh.get("/get_weight_version").json() == {"weight_version": "0"}
        ok = fresh.post("/update_weights_from_disk",
                        json={"model_path": str(root / "v1"), "weight_version": "1", "sha256": digest})
        assert ok.status_code == 200 and ok.json()["weight_version"] == "1"
        back = fresh.post("/update_weights_from_disk", json={"model_path": str(tiny_model_dir), "weight_version": "0"})
        assert back.status_code == 200  # the start-up weights are always inside


def test_the_digest_is_the_one_the_trainer_publishes(perturbed_model_dir: Path) -> None:
    from trainer_svc.checkpoint import weights_sha256

    assert checkpoint_sha256(perturbed_model_dir) == weights_sha256(perturbed_model_dir)


def test_control_endpoints_need_the_key_when_one_is_set(tiny_model_dir: Path) -> None:
    config = InferenceConfig(model_path=tiny_model_dir, max_context=256, port=0, control_key=SecretStr("k3y"))
    with TestClient(create_app(config)) as keyed:
        calls = [("post", "/pause_generation", {"mode": "abort"}), ("post", "/continue_generation", {}),
                 ("post", "/abort_request", {"abort_all": True}), ("post", "/flush_cache", None),
                 ("get", "/flush_cache", None),
                 ("post", "/update_weights_from_disk", {"model_path": str(tiny_model_dir)})]
        for method, path, body in calls:
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic k3y"}):
                refused = keyed.request(method, path, json=body, headers=headers)
                assert refused.status_code == 401, (path, headers, refused.text)
                assert refused.headers["www-authenticate"] == "Bearer"
                assert refused.json()["error"]["type"] == "authentication_error"
        auth = {"Authorization": "Bearer k3y"}
        assert keyed.post("/pause_generation", json={"mode": "in_place"}, headers=auth).status_code == 200
        assert keyed.post("/continue_generation", json={}, headers=auth).status_code == 200
        assert keyed.post("/flush_cache", headers=auth).status_code == 200
        assert generate_ok(keyed)["meta_info"]["weight_version"] == "0"  # the data plane needs no key
        assert keyed.get("/health").status_code == 200


def test_no_key_means_loopback_only(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SFLOW_INFERENCE_KEY", raising=False)
    for host in ("0.0.0.0", "10.1.2.3", "example.org", "::"):
        with pytest.raises(ValidationError, match="not a loopback address and no control_key"):
            InferenceConfig(model_path=tiny_model_dir, host=host)
    for host in ("127.0.0.1", "127.5.0.1", "::1", "localhost"):
        assert InferenceConfig(model_path=tiny_model_dir, host=host).control_key is None
    keyed = InferenceConfig(model_path=tiny_model_dir, host="0.0.0.0", control_key=SecretStr("k"))
    assert keyed.control_key is not None
    monkeypatch.setenv("SFLOW_INFERENCE_KEY", "from-env")
    keyed = InferenceConfig(model_path=tiny_model_dir, host="0.0.0.0")
    assert keyed.control_key is not None and keyed.control_key.get_secret_value() == "from-env"
    assert "from-env" not in repr(keyed)


def test_openapi_document_resolves_every_reference(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    refs: list[str] = []
    stack: list[Any] = [spec]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            refs.extend(v for k, v in node.items() if k == "$ref")
            stack.extend(v for k, v in node.items() if k != "$ref")
        elif isinstance(node, list):
            stack.extend(node)
    assert refs
    for ref in refs:
        assert ref.startswith("#/"), ref
        target: Any = spec
        for part in ref[2:].split("/"):
            assert isinstance(target, dict) and part in target, f"unresolvable {ref}"
            target = target[part]
    operation_ids = [op["operationId"] for ops in spec["paths"].values() for op in ops.values()]
    assert len(operation_ids) == len(set(operation_ids))
