"""`python -m inference_svc --model-path DIR [--port 30000 ...]`: parse config -> build -> run.

Every `InferenceConfig` field is a flag (`--max-running-requests 32`); `--sglang-arg=--flag` may repeat
(write it with `=`, since its value starts with dashes).
The native backend serves `create_app(config)` with uvicorn; the sglang backend launches SGLang on the
same host/port and waits on it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import TYPE_CHECKING

from pydantic import ValidationError

from bus.kit import FlagError, add_config_flags, build_or_exit, config_values
from bus.log import configure_logging
from inference_svc.config import InferenceConfig

if TYPE_CHECKING:
    from bus.metrics import ServiceMetrics
    from inference_svc.bus_shell import InferenceBusShell
    from inference_svc.engine import NativeEngine


def parse_config(argv: list[str] | None = None) -> InferenceConfig:
    parser = argparse.ArgumentParser(prog="python -m inference_svc", description=__doc__.splitlines()[0])
    add_config_flags(parser, InferenceConfig, repeat={"sglang_args": "--sglang-arg", "capabilities": "--capability"},
                     required=True)
    values = vars(parser.parse_args(argv))
    return build_or_exit(parser, lambda: InferenceConfig.model_validate(config_values(InferenceConfig, values)),
                         (ValidationError, FlagError))


def main(argv: list[str] | None = None) -> None:
    config = parse_config(argv)
    configure_logging(f"inference-{config.resource_id}", config.log_level)
    if config.backend == "sglang":
        from inference_svc.sglang_backend import SGLangServer

        server = SGLangServer(config).start()
        try:
            sys.exit(server.wait())
        finally:
            server.stop()
    import uvicorn

    from inference_svc.app import create_app
    from inference_svc.engine import NativeEngine

    engine = NativeEngine.from_config(config)
    app = create_app(config, engine=engine)
    shell = _join_bus(config, engine, app.state.metrics) if config.join_bus else None
    try:
        uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level)
    finally:
        if shell is not None:
            shell.stop()
        engine.shutdown()
    if shell is not None and shell.failure is not None:
        raise SystemExit(f"inference {config.resource_id}: {shell.failure}")


def _join_bus(config: InferenceConfig, engine: NativeEngine, metrics: ServiceMetrics) -> InferenceBusShell:
    """Starts the bus shell (registration, heartbeats, control) for a native engine."""
    from bus.config import BusConfig
    from inference_svc.bus_shell import InferenceBusShell
    from inference_svc.controller import InferenceController, describe_resource

    if config.port == 0:
        raise SystemExit("--join-bus needs a fixed --port: the registered endpoint must be reachable")
    controller = InferenceController(engine, config.resource_id, startup_weights=config.model_path)
    shell = InferenceBusShell(
        BusConfig.from_env(client_id=f"infer-{config.resource_id}"),
        controller,
        describe_resource(config),
        endpoint=config.advertise_url or f"http://{config.host}:{config.port}",
        model=config.served_model_name,
        capabilities=config.capabilities,
        heartbeat_s=config.heartbeat_interval_s,
        on_failure=lambda _reason: os.kill(os.getpid(), signal.SIGTERM),  # uvicorn shuts down, main exits 1
        metrics=metrics,
    )
    shell.start()
    return shell


if __name__ == "__main__":
    main()
