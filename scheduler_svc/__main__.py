"""`python -m scheduler_svc --dataset tasks.jsonl [--policy spatiotemporal --train-resources 2 ...]`: parse
config -> build -> run.

Every scalar `SchedulerServiceConfig` field is a flag (`--train-batch-groups 16`, `--no-strict-staleness`);
Kafka comes from `--bootstrap-servers` / `--topic-prefix` or the environment (SFLOW_BOOTSTRAP,
SFLOW_TOPIC_PREFIX). `--dump-state` rebuilds the run's state from its journal, prints it as JSON and
exits without consuming or publishing anything. SIGTERM / SIGINT stop the service after the batch in
hand (a final checkpoint records the state).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import typing
from typing import Any

from bus.config import BusConfig
from bus.errors import BusError
from bus.log import configure_logging
from scheduler_svc.config import SchedulerServiceConfig
from scheduler_svc.errors import SchedulerError
from scheduler_svc.service import SchedulerService, dump_state


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scheduler_svc", description=__doc__.splitlines()[0])
    for name, field in SchedulerServiceConfig.model_fields.items():
        if name == "bus":
            continue
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, action=argparse.BooleanOptionalAction,
                                help=field.description)
        else:
            default = "required" if field.is_required() else field.default
            parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, help=f"{field.description} "
                                f"(default: {default})")
    parser.add_argument("--bootstrap-servers", default=None, help="Kafka brokers (default: $SFLOW_BOOTSTRAP)")
    parser.add_argument("--topic-prefix", default=None, help="topic prefix (default: $SFLOW_TOPIC_PREFIX or sf.)")
    parser.add_argument("--dump-state", action="store_true", help="print the state rebuilt from the journal, exit")
    return parser


def _none_values(values: dict[str, Any]) -> dict[str, Any]:
    """`--batch-timeout-s none` for optional fields."""
    out = {}
    for name, value in values.items():
        field = SchedulerServiceConfig.model_fields.get(name)
        optional = field is not None and type(None) in typing.get_args(field.annotation)
        out[name] = None if optional and isinstance(value, str) and value.lower() in ("none", "") else value
    return out


def parse_config(argv: list[str] | None = None) -> tuple[SchedulerServiceConfig, bool]:
    parser = build_parser()
    values: dict[str, Any] = vars(parser.parse_args(argv))
    dump = values.pop("dump_state")
    bootstrap, prefix = values.pop("bootstrap_servers"), values.pop("topic_prefix")
    try:
        env_bus = BusConfig.from_env(client_id="scheduler")
        values["bus"] = BusConfig(
            bootstrap_servers=bootstrap or env_bus.bootstrap_servers,
            topic_prefix=env_bus.topic_prefix if prefix is None else prefix,
            client_id="scheduler",
            replication_factor=env_bus.replication_factor,
        )
        return SchedulerServiceConfig.build(**_none_values(values)), dump
    except (SchedulerError, BusError, ValueError) as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> int:
    config, dump = parse_config(argv)
    configure_logging("scheduler", config.log_level)
    try:
        if dump:
            print(json.dumps(dump_state(config), indent=1, sort_keys=True))
            return 0
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        SchedulerService(config).run(stop)
    except (SchedulerError, BusError) as e:
        print(f"scheduler_svc: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
