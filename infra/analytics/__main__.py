"""`python -m infra.analytics [--data-dir DIR | --clickhouse-url URL] [--topics llm.calls,sessions ...]`

Runs the analytics sink: parse config -> open the store -> consume until SIGINT/SIGTERM (or `--idle-exit-s`).
Every `AnalyticsConfig` field is a flag (`--batch-max-events 1000`); `--topics` takes a comma list, and
`none` unsets an optional field (`--group-instance-id none`: dynamic group membership). Exit status: 0 after
a signal or `--idle-exit-s`, 2 when the store or the bus fails (nothing is committed past the stored rows).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from pydantic import ValidationError

from bus.errors import BusError
from bus.log import configure_logging
from infra.analytics.config import AnalyticsConfig, open_store
from infra.analytics.errors import AnalyticsError
from infra.analytics.sink import AnalyticsSink


def parse_config(argv: list[str] | None = None) -> AnalyticsConfig:
    parser = argparse.ArgumentParser(prog="python -m infra.analytics", description=__doc__.splitlines()[0])
    for name, field in AnalyticsConfig.model_fields.items():
        default = "" if field.default_factory is not None else f" (default: {field.default})"
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS,
                            help=f"{field.description}{default}")
    values = vars(parser.parse_args(argv))
    if "topics" in values:
        values["topics"] = tuple(t.strip() for t in values["topics"].split(",") if t.strip())
    for flag in ("group_instance_id", "clickhouse_url", "bootstrap_servers", "topic_prefix"):
        if values.get(flag) == "none":
            values[flag] = None
    try:
        return AnalyticsConfig.model_validate(values)
    except ValidationError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    configure_logging("analytics", config.log_level)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with open_store(config) as store:
            AnalyticsSink(config, store).run(stop)
    except (AnalyticsError, BusError) as e:
        print(f"analytics sink failed: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
