"""Schemathesis against the capture proxy (real broker, real native engine): generated requests for every
operation of its OpenAPI document, positive (fit the schemas) and negative (do not), must never get a
5xx; afterwards the proxy still serves a normal chat completion.

The proxy runs with a small context (so generated max_tokens stay cheap on 2 cores) and max_n=2;
calls use an agent key, so admin operations are exercised only up to their 401.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from bus.config import BusConfig
from tests.adapter.test_adapter_service import Proxy, start_proxy  # noqa: F401  (fixture)

pytestmark = pytest.mark.kafka
EXAMPLES_PER_OPERATION_AND_MODE = 50


def test_generated_requests_get_no_server_error_and_the_proxy_serves_afterwards(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],  # noqa: F811
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",), max_context_tokens=96, max_prompt_tokens=80,
                        default_max_tokens=4, max_n=2, long_request_timeout_s=30)
    schema = schemathesis.openapi.from_url(f"{proxy.url}/openapi.json")
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []
    started = time.monotonic()
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"the proxy's OpenAPI document has an unusable operation: {result!r}"
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, proxy, statuses, server_errors)
            except Unsatisfiable:  # nothing to get wrong (GET /health has no parameters)
                assert mode is GenerationMode.NEGATIVE, operation.label
    elapsed = time.monotonic() - started
    print(f"fuzz: {sum(statuses.values())} cases in {elapsed:.1f}s, statuses {dict(sorted(statuses.items()))}")
    assert not server_errors, "\n".join(server_errors[:20])
    assert sum(statuses.values()) >= 200 and statuses[200] > 0
    reply = proxy.client(session="after-fuzz").chat.completions.create(
        model=proxy.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].message.content is not None


def _fuzz(operation: schemathesis.APIOperation, mode: GenerationMode, proxy: Proxy, statuses: Counter[int],
          server_errors: list[str]) -> None:
    """EXAMPLES_PER_OPERATION_AND_MODE generated calls of one operation, answers tallied."""

    @settings(max_examples=EXAMPLES_PER_OPERATION_AND_MODE, deadline=None, database=None,
              derandomize=True, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case: schemathesis.Case) -> None:
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = proxy.model  # past the 404, into templating and the engine
        response = case.call(base_url=proxy.url, headers={"Authorization": "Bearer key-a"}, timeout=60)
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            server_errors.append(f"{case.method} {case.formatted_path} {case.body!r:.300}"
                                 f" -> {response.status_code} {response.text[:300]}")

    call()
