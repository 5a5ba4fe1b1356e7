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
import sys
from typing import Any

from bus.errors import BusError
from bus.kit import add_bus_flags, add_config_flags, build_or_exit, config_values, pop_bus_settings, run_until_signalled
from bus.log import configure_logging
from scheduler_svc.config import SchedulerServiceConfig
from scheduler_svc.errors import SchedulerError
from scheduler_svc.service import SchedulerService, dump_state


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scheduler_svc", description=__doc__.splitlines()[0])
    add_config_flags(parser, SchedulerServiceConfig, skip={"bus"})
    add_bus_flags(parser)
    parser.add_argument("--dump-state", action="store_true", help="print the state rebuilt from the journal, exit")
    return parser


def parse_config(argv: list[str] | None = None) -> tuple[SchedulerServiceConfig, bool]:
    parser = build_parser()
    values: dict[str, Any] = vars(parser.parse_args(argv))
    dump = values.pop("dump_state")

    def build() -> SchedulerServiceConfig:
        bus = pop_bus_settings(values, client_id="scheduler")
        return SchedulerServiceConfig.build(bus=bus, **config_values(SchedulerServiceConfig, values))

    return build_or_exit(parser, build, (SchedulerError, BusError, ValueError)), dump


def main(argv: list[str] | None = None) -> int:
    config, dump = parse_config(argv)
    configure_logging("scheduler", config.log_level)
    try:
        if dump:
            print(json.dumps(dump_state(config), indent=1, sort_keys=True))
            return 0
        run_until_signalled(lambda stop: SchedulerService(config).run(stop))
    except (SchedulerError, BusError) as e:
        print(f"scheduler_svc: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0

if __name__ == "__main__":
    sys.exit(main())
