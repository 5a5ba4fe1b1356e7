"""bench/proxy_steps.py: the steps it times are the proxy's own, and its token-in/token-out prompts are the
ones a full render gives (else its timings would be of a different computation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.config import AdapterConfig
from inference_svc.default_model import create_default_model
from tests.unit.bench.bench_modules import load_bench

pytestmark = pytest.mark.unit

proxy_steps = load_bench("proxy_steps")


def test_every_step_is_timed_on_every_measured_call(tmp_path: Path) -> None:
    model = create_default_model(tmp_path / "model")
    codec = ChatCodec.from_model_dir(model)
    spent, calls = proxy_steps.measure_steps(codec, AdapterConfig(model_path=model), turns=6, rounds=2)
    assert calls == 12  # the warm-up session is not counted
    assert set(spent) == {*proxy_steps.STEPS, "full re-render"}
    assert all(seconds > 0 for seconds in spent.values())


def test_a_prompt_that_differs_from_the_full_render_stops_the_bench(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = create_default_model(tmp_path / "model")
    codec = ChatCodec.from_model_dir(model)
    render = codec.render
    monkeypatch.setattr(codec, "render", lambda messages, *a, **k: render(messages, *a, **k) + " ")
    with pytest.raises(SystemExit, match="differs from the full render"):
        proxy_steps.measure_steps(codec, AdapterConfig(model_path=model), turns=3, rounds=1)


def test_a_session_ends_where_the_proxy_would_refuse_its_prompt(tmp_path: Path) -> None:
    model = create_default_model(tmp_path / "model")
    codec = ChatCodec.from_model_dir(model)
    _, whole = proxy_steps.measure_steps(codec, AdapterConfig(model_path=model), turns=8, rounds=1)
    _, cut = proxy_steps.measure_steps(codec, AdapterConfig(model_path=model, max_context_tokens=120,
                                                                  max_prompt_tokens=100), turns=8, rounds=1)
    assert whole == 8
    assert 0 < cut < 8
