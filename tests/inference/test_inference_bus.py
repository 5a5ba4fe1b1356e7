"""The inference service on the real bus: it registers, beats, and obeys control commands."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bus.config import BusConfig
from bus.consumer import EventConsumer, unique_group
from bus.producer import EventProducer
from schemas import events as ev

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def service(bus_config: BusConfig, tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "SFLOW_BOOTSTRAP": bus_config.bootstrap_servers, "SFLOW_TOPIC_PREFIX": bus_config.topic_prefix}
    log = open(tmp_path / "infer.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "inference_svc", "--model-path", str(tiny_model_dir), "--port", str(port),
         "--resource-id", "r7", "--join-bus", "--capability", "rollout", "--capability", "train",
         "--heartbeat-interval-s", "0.5", "--peak-flops", "1e12", "--hbm-bandwidth", "1e10",
         "--served-model-name", "tiny", "--max-context", "1024"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "infer.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


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
        load = ev.LoadWeights(resource_id="r7", version=1, uri=f"file://{perturbed_model_dir}", sha256="")
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


