"""The async client against a real uvicorn server on 127.0.0.1, and the controller over both engines."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from bus.ports import free_port
from inference_svc.app import create_app
from inference_svc.config import InferenceConfig
from inference_svc.controller import InferenceController, describe_resource, weights_path_from_uri
from inference_svc.engine import NativeEngine
from inference_svc.weights import checkpoint_sha256
from schemas.inference.client import InferenceClient, RemoteEngineControl, generate_payload
from schemas.inference.errors import InferenceHTTPError, InvalidRequestError
from schemas.inference.types import SamplingOptions

pytestmark = pytest.mark.unit

PROMPTS = [[1, 2, 3], [50, 51], [7] * 6, [200, 100, 50, 25]]


@pytest.fixture
def served(tiny_model_dir: Path, perturbed_model_dir: Path) -> Iterator[tuple[str, NativeEngine]]:
    """A real server in a thread; yields its base URL and its engine (for test-side waiting)."""
    config = InferenceConfig(model_path=tiny_model_dir, max_context=512, port=free_port(),
                             weights_root=perturbed_model_dir)
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield config.base_url, app.state.engine
    server.should_exit = True
    thread.join(10)


def wait_for_tokens(engine: NativeEngine, n_requests: int, at_least: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = engine.snapshot()
        if len(snap) == n_requests and all(len(s.output_ids) >= at_least for s in snap):
            return
        time.sleep(0.002)
    raise AssertionError(f"requests did not reach {at_least} tokens")


def sampling(seed: int, max_new_tokens: int) -> dict[str, object]:
    return {"max_new_tokens": max_new_tokens, "ignore_eos": True, "sampling_seed": seed}


def test_client_drives_interrupt_swap_resume_and_abort_over_http(
    served: tuple[str, NativeEngine], perturbed_model_dir: Path
) -> None:
    base_url, engine = served

    async def scenario() -> None:
        async with InferenceClient(base_url) as client:
            assert await client.health()
            running = [asyncio.create_task(client.generate(p, sampling(i, 300))) for i, p in enumerate(PROMPTS)]
            await asyncio.to_thread(wait_for_tokens, engine, len(PROMPTS), 5)
            assert (await client.pause("in_place")).num_requests == len(PROMPTS)
            update = await client.update_weights_from_disk(perturbed_model_dir, 1)
            assert update.success and update.weight_version == "1" and update.num_paused_requests == len(PROMPTS)
            await client.resume()
            for done in await asyncio.gather(*running):
                versions = done.token_versions()
                cut = versions.index(1)
                assert done.finish_type == "length" and len(done.output_ids) == 300
                assert cut >= 5 and versions == [0] * cut + [1] * (300 - cut)
                assert len(done.token_logprobs()) == 300

            running = [asyncio.create_task(client.generate(p, sampling(i, 200))) for i, p in enumerate(PROMPTS)]
            await asyncio.to_thread(wait_for_tokens, engine, len(PROMPTS), 5)
            await client.pause("abort")
            partials = await asyncio.gather(*running)
            waiting = asyncio.create_task(client.generate(PROMPTS[0], sampling(9, 5)))
            await asyncio.sleep(0.2)
            assert not waiting.done()  # a request sent while paused waits for the resume
            await client.resume()
            assert (await waiting).finish_type == "length"
            for prompt, partial in zip(PROMPTS, partials, strict=True):
                k = len(partial.output_ids)
                assert partial.finish_type == "abort" and 5 <= k < 200 and partial.token_versions() == [1] * k
                rest = await client.generate(prompt + partial.output_ids, sampling(3, 200 - k))
                assert rest.finish_type == "length" and k + len(rest.output_ids) == 200

            with pytest.raises(InferenceHTTPError) as bad:
                await client.generate([999], {"max_new_tokens": 2})
            assert bad.value.status_code == 400 and "999" in bad.value.message
            with pytest.raises(InferenceHTTPError) as missing:
                await client.update_weights_from_disk(perturbed_model_dir / "nope", 2)
            assert missing.value.status_code == 400 and missing.value.error_type == "weight_load_error"
            assert await client.weight_version() == "1"
            assert await client.abort(abort_all=True) == 0
            assert await client.flush_cache()
            assert len((await client.generate([1, 2], {"max_new_tokens": 3})).output_ids) == 3

    asyncio.run(scenario())


def test_controller_over_http_loads_weights_and_reports_failures(
    served: tuple[str, NativeEngine], perturbed_model_dir: Path
) -> None:
    base_url, engine = served
    control = RemoteEngineControl(base_url)
    try:
        controller = InferenceController(control, "rollout-7")
        long = [SamplingOptions(max_new_tokens=300, ignore_eos=True, seed=i) for i in range(len(PROMPTS))]
        futures = [engine.submit(p, s) for p, s in zip(PROMPTS, long, strict=True)]
        wait_for_tokens(engine, len(PROMPTS), 3)
        loaded = controller.on_load_weights(perturbed_model_dir.as_uri(), 5, checkpoint_sha256(perturbed_model_dir))
        assert loaded.ok and loaded.version == 5 and loaded.resource_id == "rollout-7", loaded.error
        assert loaded.pause_ms >= loaded.load_ms > 0 and loaded.num_paused_requests == len(PROMPTS)
        assert all(5 in f.result(timeout=60).output_versions for f in futures)
        wrong_scheme = controller.on_load_weights("s3://bucket/step-6", 6, "0" * 64)
        missing = controller.on_load_weights((perturbed_model_dir / "missing").as_uri(), 6, "0" * 64)
        wrong_digest = controller.on_load_weights(perturbed_model_dir.as_uri(), 6, "0" * 64)
        unverified = controller.on_load_weights(perturbed_model_dir.as_uri(), 6)
        for failed in (wrong_scheme, missing, wrong_digest, unverified):
            assert not failed.ok and failed.version == 5 and failed.error
        assert "sha256" in wrong_digest.error and "carries no sha256" in unverified.error
        assert not engine.paused and control.weight_version == 5
        assert control.stats() == engine.stats()
        assert controller.on_pause("abort").num_requests == 0 and controller.paused
        assert controller.on_resume().paused_ms > 0 and not controller.paused
        assert controller.on_abort_all().num_aborted == 0
    finally:
        control.close()


def test_controller_over_the_in_process_engine(engine: NativeEngine, perturbed_model_dir: Path) -> None:
    controller = InferenceController(engine, "rollout-0")
    future = engine.submit(PROMPTS[0], SamplingOptions(max_new_tokens=300, ignore_eos=True, seed=1))
    wait_for_tokens(engine, 1, 3)
    held = controller.on_pause("in_place")
    assert held.num_requests == 1 and held.pause_ms >= 0
    loaded = controller.on_load_weights(str(perturbed_model_dir), 2, checkpoint_sha256(perturbed_model_dir))
    # already paused in place for the sync: stays paused, and the pause so far is the sync's pause
    assert loaded.ok and loaded.pause_ms > 0 and engine.paused
    controller.on_resume()
    result = future.result(timeout=30)
    assert result.output_versions[0] == 0 and result.output_versions[-1] == 2
    with pytest.raises(InvalidRequestError):
        controller.on_pause("sleep")
    busy = engine.submit(PROMPTS[1], SamplingOptions(max_new_tokens=300, ignore_eos=True, seed=2))
    wait_for_tokens(engine, 1, 2)
    assert controller.on_abort_all().num_aborted == 1
    assert busy.result(timeout=10).finish_reason.type == "abort"  # type: ignore[union-attr]


def test_a_load_that_raises_anything_is_reported_and_never_leaves_the_engine_paused(
    engine: NativeEngine, perturbed_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = InferenceController(engine, "rollout-0")

    def broken_read(*_args: object, **_kwargs: object) -> None:
        raise MemoryError("no room for the checkpoint")  # not an InferenceError

    monkeypatch.setattr("inference_svc.engine.read_checkpoint", broken_read)
    failed = controller.on_load_weights(str(perturbed_model_dir), 3, checkpoint_sha256(perturbed_model_dir))
    assert not failed.ok and "MemoryError" in failed.error and failed.version == 0
    assert not engine.paused and engine.weight_version == 0
    assert len(engine.generate([1, 2], SamplingOptions(max_new_tokens=2), timeout_s=30).output_ids) == 2


def test_unverified_loads_only_of_the_startup_weights(engine: NativeEngine, tiny_model_dir: Path,
                                                        perturbed_model_dir: Path) -> None:
    controller = InferenceController(engine, "rollout-0", startup_weights=tiny_model_dir)
    refused = controller.on_load_weights(perturbed_model_dir.as_uri(), 1)
    assert not refused.ok and "carries no sha256" in refused.error and engine.weight_version == 0
    assert controller.on_load_weights(tiny_model_dir.as_uri(), 0).ok  # the version-0 reload the scheduler sends


def test_client_sends_the_control_key_from_the_environment(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SFLOW_INFERENCE_KEY", "sesame")
    config = InferenceConfig(model_path=tiny_model_dir, max_context=256, port=free_port())
    assert config.control_key is not None
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

        async def scenario() -> None:
            async with InferenceClient(config.base_url) as client:  # the key comes from the environment
                assert (await client.pause("in_place")).status == "ok"
                assert (await client.resume()).status == "ok"
                assert await client.abort(abort_all=True) == 0
            async with InferenceClient(config.base_url, control_key="wrong") as stranger:
                with pytest.raises(InferenceHTTPError) as refused:
                    await stranger.pause("abort")
                assert refused.value.status_code == 401
                assert len((await stranger.generate([1, 2], {"max_new_tokens": 2})).output_ids) == 2  # data plane

        asyncio.run(scenario())
        control = RemoteEngineControl(config.base_url)
        try:
            assert control.pause("in_place") == 0
            control.resume()
        finally:
            control.close()
    finally:
        server.should_exit = True
        thread.join(10)


def test_weights_uri_forms(tmp_path: Path) -> None:
    assert weights_path_from_uri(tmp_path.as_uri()) == tmp_path
    assert weights_path_from_uri(str(tmp_path)) == tmp_path
    with pytest.raises(InvalidRequestError):
        weights_path_from_uri("hdfs://x/y")


def test_resource_description_measures_or_takes_declared_values(tiny_model_dir: Path) -> None:
    measured = describe_resource(InferenceConfig(model_path=tiny_model_dir, resource_id="cpu-0"), measure_s=0.05)
    assert measured.device_kind == "cpu" and measured.measured and measured.resource_id == "cpu-0"
    assert measured.peak_flops > 1e8 and measured.hbm_bandwidth > 1e8 and measured.memory_bytes > 0
    declared = describe_resource(
        InferenceConfig(model_path=tiny_model_dir, peak_flops=2e12, hbm_bandwidth=1e11, memory_bytes=1 << 30)
    )
    assert not declared.measured and declared.peak_flops == 2e12 and declared.memory_bytes == 1 << 30
    assert declared.ridge_point == 20.0


def test_generate_payload_uses_sglang_field_names() -> None:
    payload = generate_payload([1, 2], {"max_new_tokens": 8, "seed": 3, "temperature": 0.5}, rid="abc")
    assert payload == {
        "rid": "abc",
        "input_ids": [1, 2],
        "sampling_params": {"max_new_tokens": 8, "temperature": 0.5, "sampling_seed": 3},
        "return_logprob": True,
    }


def test_a_caller_that_hangs_up_frees_its_slot(served: tuple[str, NativeEngine]) -> None:
    base_url, engine = served

    async def hang_up() -> None:
        async with InferenceClient(base_url, timeout_s=0.3) as client:
            with pytest.raises(InferenceHTTPError):
                await client.generate([1, 2, 3], sampling(1, 500), rid="gone")

    engine.pause("in_place")  # keeps the request queued, so it cannot finish before the caller leaves
    asyncio.run(hang_up())
    deadline = time.monotonic() + 10
    while any(s.rid == "gone" for s in engine.snapshot()):
        assert time.monotonic() < deadline, "the request of a disconnected caller kept its slot"
        time.sleep(0.05)
    engine.resume()
