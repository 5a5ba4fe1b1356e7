"""`python -m infra.analytics [--data-dir DIR | --clickhouse-url URL] [--topics llm.calls,sessions ...]`

Runs the analytics sink: parse config -> open the store -> consume until SIGINT/SIGTERM (or `--idle-exit-s`).
Every `AnalyticsConfig` field is a flag (`--batch-max-events 1000`); `--topics` takes a comma list, and
`none` unsets an optional field (`--group-instance-id none`: dynamic group membership). Exit status: 0 after
a signal or `--idle-exit-s`, 2 when the store or the bus fails (nothing is committed past the stored rows).
"""

from __future__ import annotations

import argparse
import sys
import threading
from functools import partial

from bus.errors import BusError
from bus.kit import add_config_flags, build_or_exit, config_values, run_until_signalled
from bus.log import configure_logging
from infra.analytics.config import AnalyticsConfig, open_store
from infra.analytics.errors import AnalyticsConfigError, AnalyticsError
from infra.analytics.sink import AnalyticsSink


def parse_config(argv: list[str] | None = None) -> AnalyticsConfig:
    parser = argparse.ArgumentParser(prog="python -m infra.analytics", description=__doc__.splitlines()[0])
    add_config_flags(parser, AnalyticsConfig)
    values = vars(parser.parse_args(argv))

    def build() -> AnalyticsConfig:
        # The comma list is this program's own; the topic prefix is taken as given except `none` (an
        # empty prefix is a prefix, as with every service's --topic-prefix).
        typed = config_values(AnalyticsConfig, values, raw=("topics", "topic_prefix"))
        if "topics" in typed:
            typed["topics"] = tuple(t.strip() for t in typed["topics"].split(",") if t.strip())
        if typed.get("topic_prefix") == "none":
            typed["topic_prefix"] = None
        return AnalyticsConfig(**typed)

    return build_or_exit(parser, build, (AnalyticsConfigError, BusError, ValueError))


def serve(config: AnalyticsConfig, stop: threading.Event) -> int:
    """The sink on the configured store until `stop`; the exit status."""
    try:
        with open_store(config) as store:
            AnalyticsSink(config, store).run(stop)
    except (AnalyticsError, BusError) as e:
        print(f"analytics sink failed: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    configure_logging("analytics", config.log_level)
    return run_until_signalled(partial(serve, config))


if __name__ == "__main__":
    sys.exit(main())
