"""Schemathesis against the inference app (real native engine on the default tiny model, real uvicorn on
127.0.0.1): generated requests for every operation of its OpenAPI document, positive (fit the schemas)
and negative (do not), must never get a 5xx; afterwards the engine still generates. Then the hand-made
hostile inputs of issue 17, sent as raw bytes over the wire, each with its own assertion.

The app runs with a control key and the calls carry it, so the control endpoints are fuzzed for real:
a generated pause is lifted after its case (a paused engine queues generate requests, by design), so
every case meets a serving engine. A small context keeps generated max_new_tokens cheap on 2 cores.
Self-contained (its own model and server fixtures): the suite's conftest belongs to the proxy fuzzing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
import torch
import uvicorn
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from openapi_spec_validator import validate
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from bus.ports import free_port
from inference_svc.app import create_app
from inference_svc.config import InferenceConfig
from inference_svc.default_model import create_default_model
from inference_svc.engine import NativeEngine
from tests.factories import TINY_SPEC

pytestmark = pytest.mark.unit
EXAMPLES_PER_OPERATION_AND_MODE = 60
KEY = "fuzz-control-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def inference_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, NativeEngine]]:
    """`create_app` under uvicorn in a thread, on the default tiny model; yields (base URL, engine)."""
    torch.set_num_threads(1)
    model = create_default_model(tmp_path_factory.mktemp("fuzz-inference-model"), TINY_SPEC)
    config = InferenceConfig(model_path=model, max_context=48, max_running_requests=8, port=free_port(),
                             control_key=SecretStr(KEY))
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield config.base_url, app.state.engine
    finally:
        server.should_exit = True
        thread.join(15)
        app.state.engine.shutdown()


def assert_serving(url: str) -> None:
    reply = httpx.post(f"{url}/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}},
                       timeout=30)
    assert reply.status_code == 200 and len(reply.json()["output_ids"]) == 3, reply.text
    assert httpx.get(f"{url}/health_generate", timeout=30).status_code == 200


def test_generated_requests_get_no_server_error_and_the_engine_serves_afterwards(
    inference_server: tuple[str, NativeEngine],
) -> None:
    url, engine = inference_server
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []
    started = time.monotonic()
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # an Err is an operation whose schema does not resolve
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=EXAMPLES_PER_OPERATION_AND_MODE, deadline=None, database=None,
                      derandomize=True, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case: schemathesis.Case) -> None:
                try:
                    response = case.call(base_url=url, headers=AUTH, timeout=60)
                finally:
                    if engine.paused:  # a generated pause (or keep_pause) would hold every later generate
                        engine.resume()
                statuses[response.status_code] += 1
                if response.status_code >= 500:
                    server_errors.append(f"{case.method} {case.formatted_path} {case.body!r:.300}"
                                         f" -> {response.status_code} {response.text[:300]}")

            try:
                call()
            except Unsatisfiable:  # no input to break: an operation without body or parameters has no negative
                assert mode is GenerationMode.NEGATIVE, operation.label
    elapsed = time.monotonic() - started
    print(f"inference fuzz: {sum(statuses.values())} cases in {elapsed:.1f}s, "
          f"statuses {dict(sorted(statuses.items()))}")
    assert not server_errors, "\n".join(server_errors[:20])
    assert sum(statuses.values()) >= 200 and statuses[200] > 0 and statuses[400] > 0
    assert engine.is_alive
    assert_serving(url)


def _raw(url: str, body: bytes, path: str = "/generate") -> httpx.Response:
    return httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json", **AUTH}, timeout=60)


HOSTILE_BODIES = [
    pytest.param(b'{"input_ids": [1], "rid": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nests deeper",
                 id="nested-100000-deep"),
    pytest.param(b'{"text": "\\ud800"}', 400, "lone UTF-16 surrogate", id="lone-surrogate"),
    pytest.param(b'{"text": "\xc3\x28"}', 400, "not valid UTF-8", id="invalid-utf8"),
    pytest.param(b'{"input_ids": [9223372036854775808]}', 400, "outside the vocabulary", id="input-id-2**63"),
    pytest.param(b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}', 400, "temperature", id="nan-temp"),
    pytest.param(b'{"input_ids": [1], "sampling_params": {"temperature": 1e400}}', 400, "temperature", id="inf-temp"),
    pytest.param(b'{"text": "' + b"a" * (9 << 20) + b'"}', 413, "max_body_bytes", id="9-MB-body"),
]


@pytest.mark.parametrize(("body", "status", "fragment"), HOSTILE_BODIES)
def test_hostile_bodies_get_a_4xx_naming_the_problem(
    inference_server: tuple[str, NativeEngine], body: bytes, status: int, fragment: str
) -> None:
    url, _ = inference_server
    response = _raw(url, body)
    assert response.status_code == status, response.text[:500]
    assert fragment in response.json()["error"]["message"]
    assert_serving(url)


def test_a_vanishing_temperature_is_greedy_and_json_clean(inference_server: tuple[str, NativeEngine]) -> None:
    url, _ = inference_server
    bodies = [{"input_ids": [5, 6, 7], "sampling_params": {"temperature": t, "max_new_tokens": 5},
               "return_logprob": True} for t in (1e-39, 0.0)]
    tiny, greedy = (httpx.post(f"{url}/generate", json=b, timeout=30) for b in bodies)
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["output_ids"] == greedy.json()["output_ids"]
    assert all(entry[0] == 0.0 for entry in tiny.json()["meta_info"]["output_token_logprobs"])


def test_control_endpoints_refuse_callers_without_the_key(inference_server: tuple[str, NativeEngine]) -> None:
    url, engine = inference_server
    for path, body in (("/pause_generation", {"mode": "abort"}), ("/update_weights_from_disk", {"model_path": "/"}),
                       ("/abort_request", {"abort_all": True}), ("/continue_generation", {}), ("/flush_cache", None)):
        response = httpx.post(f"{url}{path}", json=body, timeout=30)
        assert response.status_code == 401, (path, response.text)
    assert not engine.paused
    assert_serving(url)


def test_openapi_document_is_valid_and_every_reference_resolves(inference_server: tuple[str, NativeEngine]) -> None:
    url, _ = inference_server
    document: dict[str, Any] = httpx.get(f"{url}/openapi.json", timeout=30).json()
    validate(document)  # the OpenAPI 3.1 meta-schema, $refs included
    schema = schemathesis.openapi.from_dict(document)
    results = list(schema.get_all_operations())
    assert all(isinstance(result, Ok) for result in results), results  # an Err: an unresolvable $ref
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert {op.path for op in operations} >= {"/generate", "/pause_generation", "/update_weights_from_disk"}
    assert "HTTPBearer" in document["components"]["securitySchemes"]
