"""The inference service on the real bus: it registers, beats, and obeys control commands."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bus.config import BusConfig
from bus.consumer import EventConsumer, unique_group
from bus.errors import ConsumeError
from bus.ports import free_port
from bus.process import ManagedProcess
from bus.producer import EventProducer
from bus.replay import replay
from inference_svc.bus_shell import InferenceBusShell
from inference_svc.controller import InferenceController, ResourceDescription
from inference_svc.engine import NativeEngine
from inference_svc.weights import checkpoint_sha256
from schemas import events as ev

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def service(bus_config: BusConfig, tiny_model_dir: Path, perturbed_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = ManagedProcess("inference_svc", [
        "--model-path", str(tiny_model_dir), "--port", str(port), "--resource-id", "r7", "--join-bus",
        "--capability", "rollout", "--capability", "train", "--heartbeat-interval-s", "0.5", "--peak-flops", "1e12",
        "--hbm-bandwidth", "1e10", "--served-model-name", "tiny", "--max-context", "1024",
        "--weights-root", str(perturbed_model_dir)], log=tmp_path / "infer.log", cwd=REPO,
        env={"SFLOW_BOOTSTRAP": bus_config.bootstrap_servers, "SFLOW_TOPIC_PREFIX": bus_config.topic_prefix},
        stop_timeout_s=30.0)
    url = f"http://127.0.0.1:{port}"
    try:
        proc.start().wait_healthy(f"{url}/health", timeout_s=180)  # a loaded 2-core machine is slow to load a model
        yield url
    finally:
        proc.stop()

def wait_for(consumer: EventConsumer, pred: Callable[[ev.Event], bool], timeout_s: float = 60) -> ev.Event:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in consumer.poll(0.5):
            if pred(r.event):
                return r.event
    raise AssertionError("event not seen")


def test_registers_beats_and_obeys_control(service: str, bus_config: BusConfig, perturbed_model_dir: Path) -> None:
    watch = EventConsumer(bus_config, unique_group("watch"), ["resources", "control", "weights"])
    registered = wait_for(watch, lambda e: isinstance(e, ev.ResourceRegistered))
    assert isinstance(registered, ev.ResourceRegistered)
    assert registered.resource_id == "r7" and registered.endpoint == service
    assert registered.capabilities == ("rollout", "train") and registered.peak_flops == 1e12
    beat = wait_for(watch, lambda e: isinstance(e, ev.Heartbeat))
    assert isinstance(beat, ev.Heartbeat) and beat.weight_version == 0

    def acked(command: ev.Event) -> Callable[[ev.Event], bool]:
        return lambda e: isinstance(e, ev.ControlAck) and e.command_id == command.event_id

    with EventProducer(bus_config) as producer:
        producer.publish_sync(ev.PauseRollout(resource_id="someone-else", mode=ev.PauseMode.ABORT, reason="x"))
        pause = ev.PauseRollout(resource_id="r7", mode=ev.PauseMode.IN_PLACE, reason="weight_sync")
        producer.publish_sync(pause)
        ack = wait_for(watch, acked(pause))
        assert isinstance(ack, ev.ControlAck) and ack.ok and ack.command == "PauseRollout"
        assert httpx.get(f"{service}/engine_stats").json()["paused"] is True
        forged = ev.LoadWeights(resource_id="r7", version=1, uri=f"file://{perturbed_model_dir}", sha256="0" * 64)
        producer.publish_sync(forged)
        refused = wait_for(watch, acked(forged))
        assert isinstance(refused, ev.ControlAck) and not refused.ok and "sha256" in refused.error
        unverified = ev.LoadWeights(resource_id="r7", version=1, uri=f"file://{perturbed_model_dir}", sha256="")
        producer.publish_sync(unverified)
        refused = wait_for(watch, acked(unverified))
        assert isinstance(refused, ev.ControlAck) and not refused.ok and "carries no sha256" in refused.error
        outside = ev.LoadWeights(resource_id="r7", version=1, uri="file:///etc", sha256="0" * 64)
        producer.publish_sync(outside)
        refused = wait_for(watch, acked(outside))
        assert isinstance(refused, ev.ControlAck) and not refused.ok and "outside the weights roots" in refused.error
        assert httpx.get(f"{service}/engine_stats").json()["paused"] is True  # failed loads keep the pause it had
        load = ev.LoadWeights(resource_id="r7", version=1, uri=f"file://{perturbed_model_dir}",
                              sha256=checkpoint_sha256(perturbed_model_dir))
        producer.publish_sync(load)
        loaded = wait_for(watch, lambda e: isinstance(e, ev.WeightsLoaded))
        assert isinstance(loaded, ev.WeightsLoaded) and loaded.version == 1 and loaded.resource_id == "r7"
        assert wait_for(watch, acked(load)).ok  # type: ignore[attr-defined]
        bad = ev.LoadWeights(resource_id="r7", version=2, uri="file:///no/such/dir", sha256="")
        producer.publish_sync(bad)
        nack = wait_for(watch, acked(bad))
        assert isinstance(nack, ev.ControlAck) and not nack.ok and nack.error
        resume = ev.ResumeRollout(resource_id="r7", reason="weights loaded")
        producer.publish_sync(resume)
        assert wait_for(watch, acked(resume)).ok  # type: ignore[attr-defined]
    assert httpx.get(f"{service}/get_weight_version").json()["weight_version"] in ("1", 1)
    reply = httpx.post(f"{service}/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})
    assert reply.status_code == 200 and reply.json()["meta_info"]["output_token_versions"] == [1, 1, 1, 1][
        : len(reply.json()["output_ids"])
    ]
    watch.close()


def test_heartbeats_stop_when_the_control_consumer_dies(
    bus_config: BusConfig, engine: NativeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resource that no longer obeys control must look lost to the scheduler, not healthy."""
    resource = ResourceDescription("r9", "cpu", "cpu", 1, 1 << 30, 1e10, 1e12, measured=False)
    failures: list[str] = []
    shell = InferenceBusShell(bus_config, InferenceController(engine, "r9"), resource, endpoint="http://127.0.0.1:1",
                              model="tiny", heartbeat_s=0.2, on_failure=failures.append)
    watch = EventConsumer(bus_config, unique_group("watch"), ["resources"])
    deadline = time.monotonic() + 30
    while True:  # fresh topics: a leader is elected a moment before it serves offsets (start() replays weights)
        try:
            replay(bus_config, ["weights"])
            break
        except ConsumeError:
            assert time.monotonic() < deadline, "the weights topic never became readable"
            time.sleep(0.2)
    shell.start()
    try:
        wait_for(watch, lambda e: isinstance(e, ev.Heartbeat) and e.resource_id == "r9")
        assert shell._consumer is not None

        def broken_poll(timeout_s: float) -> list[object]:  # what a fatal consumer error looks like to the loop
            raise RuntimeError("consumer closed under the loop")

        monkeypatch.setattr(shell._consumer, "poll", broken_poll)
        deadline = time.monotonic() + 30
        while not failures:
            assert time.monotonic() < deadline, "the shell did not notice its control loop died"
            time.sleep(0.05)
        assert "control consumer died" in failures[0] and shell.failure == failures[0]
        time.sleep(0.5)  # let a beat already in flight land; then the topic must stay quiet
        watch.poll(1.0)
        quiet_since = time.monotonic()
        late = [r.event for r in watch.poll(1.5) if isinstance(r.event, ev.Heartbeat) and r.event.resource_id == "r9"]
        assert not late and time.monotonic() - quiet_since >= 1.0  # >= 5 heartbeat intervals without a beat
    finally:
        monkeypatch.undo()
        shell.stop()
        watch.close()
