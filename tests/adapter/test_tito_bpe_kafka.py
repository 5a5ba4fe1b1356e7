"""A session through a real proxy, engine and broker with the byte-level BPE and Qwen3's format: what
`llm.calls` holds is the engine's own view of each call (never re-tokenized), each turn's prompt
begins with the previous prompt and output, and the one edited history is the one fork."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agents_adapter.proxy.app import create_app
from agents_adapter.proxy.config import AdapterConfig
from bus.config import BusConfig
from inference_svc.default_model import create_default_model
from schemas import events as ev
from tests.adapter.conftest import ADAPTER_TINY_SPEC, ADMIN_KEY
from tests.adapter.support import engine_inputs, free_port, serve
from tests.adapter.test_adapter_service import CALCULATOR, echo, recorded

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def bpe_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, Any]]:
    from dataclasses import replace

    from inference_svc.app import create_app as create_engine_app
    from inference_svc.config import InferenceConfig

    model_dir = create_default_model(tmp_path_factory.mktemp("bpe-qwen3-model"),
                                     replace(ADAPTER_TINY_SPEC, tokenizer="bpe", chat_template="qwen3"))
    config = InferenceConfig(model_path=model_dir, max_context=1024, port=free_port(), resource_id="rollout-bpe",
                             max_running_requests=4, weights_root=model_dir.parent)
    app = create_engine_app(config)
    with serve(app, config.port) as url:
        yield model_dir, url, app.state.engine


def test_a_bpe_qwen3_session_records_the_engines_ids(bus_config: BusConfig, bpe_engine: tuple[Path, str, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir, url, engine = bpe_engine
    seen = engine_inputs(engine, monkeypatch)
    config = AdapterConfig.build(
        env={"SFLOW_ADAPTER_API_KEYS": "agent-a=key-a", "SFLOW_ADAPTER_ADMIN_KEY": ADMIN_KEY},
        model_path=model_dir, port=free_port(), inference_endpoints=[f"rollout-bpe={url}"], bus=bus_config,
        routing_from_events=False, delivery_timeout_ms=5000)
    with ExitStack() as stack:
        app = create_app(config)
        proxy_url = stack.enter_context(serve(app, config.port))
        client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="key-a", max_retries=0, timeout=120,
                               default_headers={"X-Session-Id": "bpe-qwen3"})
        messages: list[Any] = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "1+1?"}]
        call_ids = []
        for turn in range(5):
            if turn == 3:  # the agent rewrites an earlier answer: one fork
                messages[2] = {"role": "assistant", "content": "2, surely."}
            reply = client.chat.completions.create(model=config.model_name, messages=messages, tools=[CALCULATOR],
                                                   max_tokens=8, temperature=1.0)
            assert reply.model_extra is not None
            call_ids.append(reply.model_extra["sflow"]["call_ids"][0])
            messages += [echo(reply.choices[0].message), {"role": "user", "content": f"and {turn}+1? é 日本"}]
        stats = httpx.get(f"{proxy_url}/admin/stats", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    gc.collect()  # the proxy's librdkafka handles go now, not when the broker is long gone

    calls = {c.call_id: c for c in recorded(bus_config, "llm.calls", ev.LLMCall)}
    ordered = [calls[i] for i in call_ids]
    for k, call in enumerate(ordered):
        engine_input, future = seen[f"{call.call_id}-0"]
        assert list(call.prompt_ids) == engine_input and list(call.output_ids) == future.result().output_ids
        assert call.drift == (k == 3)
        if k and k != 3:
            history = list(ordered[k - 1].prompt_ids) + list(ordered[k - 1].output_ids)
            assert list(call.prompt_ids[: len(history)]) == history and call.parent_call_id == ordered[k - 1].call_id
    classes = stats["drift_classes_by_agent"]["agent-a"]
    assert classes["fork"] == 1 and classes["continuation"] + classes["realigned"] == 3
    assert stats["drift_by_agent"] == {"agent-a": 1}
    assert app.state.service.codec.vocab_size > 4096  # the BPE, not the byte-level tokenizer
