"""The inference resource on the bus: registers itself, sends heartbeats, and obeys `control` events.

It catches up on `weights` before registering (a restarted resource loads the newest published
policy first, so it never serves stale weights), then answers PauseRollout / ResumeRollout /
LoadWeights addressed to its resource id with the controller, and reports `ControlAck` and
`WeightsLoaded` (with the pause it caused). Commands sent while the process was down are not
replayed: each process start reads `control` from its end, and the scheduler treats the new
`ResourceRegistered` as a recovered resource.

Heartbeats say "this resource obeys control". So they stop for good once the control consumer thread
dies (or the engine loop does): the scheduler then sees the resource lost after its heartbeat timeout
and reassigns its work, instead of waiting on a healthy-looking resource that acknowledges nothing.
`on_failure` (the process entry point passes one that exits the process) hears why.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bus.config import BusConfig
from bus.consumer import EventConsumer, Received
from bus.metrics import ServiceMetrics
from bus.producer import EventProducer
from bus.replay import replay
from inference_svc.controller import InferenceController, ResourceDescription
from schemas.events import (
    ControlAck,
    Event,
    Heartbeat,
    LoadWeights,
    PauseRollout,
    ResourceRegistered,
    ResumeRollout,
    WeightsLoaded,
    WeightsPublished,
)

log = logging.getLogger("sflow.inference.bus")


class InferenceBusShell:
    """Connects one engine (through its controller) to the bus."""

    def __init__(
        self,
        bus: BusConfig,
        controller: InferenceController,
        resource: ResourceDescription,
        endpoint: str,
        model: str,
        capabilities: Sequence[str] = ("rollout",),
        heartbeat_s: float = 2.0,
        on_failure: Callable[[str], None] | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.bus = bus
        self.controller = controller
        self.resource = resource
        self.endpoint = endpoint
        self.model = model
        self.capabilities = tuple(capabilities)
        self.heartbeat_s = heartbeat_s
        self.rid = resource.resource_id
        self.producer = EventProducer(bus, producer_id=f"infer-{self.rid}")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._consumer: EventConsumer | None = None
        self.on_failure = on_failure
        self.metrics = metrics
        self.failure: str | None = None  # why the shell stopped obeying control (then no more heartbeats)

    # --- start-up ---------------------------------------------------------------------------

    def catch_up_weights(self) -> int:
        """Loads the newest WeightsPublished of this model, if it is newer than what is loaded."""
        newest: WeightsPublished | None = None
        for r in replay(self.bus, ["weights"]).events:
            e = r.event
            if not isinstance(e, WeightsPublished) or e.model != self.model:
                continue
            if newest is None or e.version > newest.version:
                newest = e
        current = self.controller.engine.weight_version
        if newest is not None and newest.version > current:
            result = self.controller.on_load_weights(newest.uri, newest.version, newest.sha256)
            log.info("caught up", extra={"resource": self.rid, "version": result.version, "ok": result.ok})
            return int(result.version)
        return int(current)

    def start(self) -> None:
        self.catch_up_weights()
        latest: dict[str, Any] = {"auto.offset.reset": "latest"}
        consumer = EventConsumer(self.bus, f"infer-{self.rid}-{uuid.uuid4().hex[:8]}", ["control"],
                                 metrics=self.metrics, **latest)
        deadline = time.monotonic() + 30
        while not consumer.assigned() and time.monotonic() < deadline:
            consumer.poll(0.2)  # join the group so commands sent after registration are seen
        self._consumer = consumer
        self.producer.publish_sync(
            ResourceRegistered(
                resource_id=self.rid,
                endpoint=self.endpoint,
                device_kind=self.resource.device_name if self.resource.device_kind == "cuda" else "cpu",
                num_devices=self.resource.num_devices,
                memory_bytes=self.resource.memory_bytes,
                hbm_bandwidth=self.resource.hbm_bandwidth,
                peak_flops=self.resource.peak_flops,
                capabilities=self.capabilities,
                correlation_id=self.rid,
            )
        )
        for target, name in ((self._heartbeat_loop, "heartbeat"), (self._control_loop, "control")):
            thread = threading.Thread(target=target, name=f"{self.rid}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("registered", extra={"resource": self.rid, "endpoint": self.endpoint})

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._consumer is not None:
            self._consumer.close()
        self.producer.close()

    # --- loops -------------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if not self._engine_alive():
                self._fail("the engine loop is not running")
            if self.failure is not None:
                log.error("heartbeats stopped", extra={"resource": self.rid, "reason": self.failure})
                return
            try:
                self.producer.publish(self.heartbeat())
            except Exception:  # a heartbeat must never kill the engine process
                log.exception("heartbeat failed", extra={"resource": self.rid})

    def heartbeat(self) -> Heartbeat:
        stats = self.controller.engine.stats()
        activity = "paused" if stats.paused else ("rollout" if stats.running or stats.queued else "idle")
        return Heartbeat(
            resource_id=self.rid,
            activity=activity,
            weight_version=stats.weight_version,
            running_requests=stats.running,
            queued_requests=stats.queued,
            tokens_generated=stats.tokens_generated,
            correlation_id=self.rid,
        )

    def _engine_alive(self) -> bool:
        return self.controller.engine.is_alive

    def _control_loop(self) -> None:
        assert self._consumer is not None
        try:
            self._consumer.run(self._handle, self._stop, poll_timeout_s=0.2)
        except Exception as e:  # recorded and logged: the thread ends, and so do the heartbeats
            log.exception("control consumer died", extra={"resource": self.rid})
            self._fail(f"the control consumer died: {type(e).__name__}: {e}")
            return
        if not self._stop.is_set():
            self._fail("the control consumer returned")

    def _fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = reason
        log.critical("resource stops obeying control", extra={"resource": self.rid, "reason": reason})
        if self.on_failure is not None:
            self.on_failure(reason)

    def _handle(self, r: Received) -> None:
        event = r.event
        if getattr(event, "resource_id", None) != self.rid or isinstance(event, ControlAck):
            return
        for out in self.respond(event):
            self.producer.publish_sync(out)

    def respond(self, event: Event) -> list[Event]:
        """The events answering one control command (the functional part of the shell)."""
        started = time.perf_counter()
        if isinstance(event, PauseRollout):
            ack = self.controller.on_pause(str(event.mode))
            return [self._ack(event, True, "", ack.pause_ms)]
        if isinstance(event, ResumeRollout):
            self.controller.on_resume()
            return [self._ack(event, True, "", (time.perf_counter() - started) * 1000)]
        if isinstance(event, LoadWeights):
            result = self.controller.on_load_weights(event.uri, event.version, event.sha256)
            out: list[Event] = []
            if result.ok:
                out.append(
                    WeightsLoaded(
                        model=self.model,
                        resource_id=self.rid,
                        version=int(result.version),
                        pause_ms=result.pause_ms,
                        load_ms=result.load_ms,
                        correlation_id=event.event_id,
                    )
                )
            out.append(self._ack(event, result.ok, result.error, (time.perf_counter() - started) * 1000))
            return out
        return []

    def _ack(self, command: Event, ok: bool, error: str, duration_ms: float) -> ControlAck:
        return ControlAck(
            resource_id=self.rid,
            command_id=command.event_id,
            command=command.event_type,
            ok=ok,
            error=error,
            duration_ms=duration_ms,
            correlation_id=command.event_id,
        )
