"""`python -m trainer_svc --run-id R --base-model-dir DIR --weights-root DIR [--mode standalone ...]`: parse
config -> build -> run.

Settings come from `--config FILE` (YAML or JSON: the `ServiceConfig` fields, with `engine:`,
`algorithm:` and `collapse_guard:` sections), then the flags below (each scalar `ServiceConfig` field;
`--resource-id` repeats), then `--set SECTION.FIELD=VALUE` for engine/algorithm/collapse_guard fields
(`--set engine.learning_rate=1e-4`, `--set collapse_guard.window=5`; the value is read as YAML). Kafka
comes from `--bootstrap-servers` / `--topic-prefix` or the environment (SFLOW_BOOTSTRAP,
SFLOW_TOPIC_PREFIX, SFLOW_REPLICATION). SIGTERM / SIGINT stop the service after the step in hand; a
restart resumes from the newest checkpoint under `<weights-root>/<run-id>`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from bus.errors import BusError
from bus.kit import add_bus_flags, add_config_flags, build_or_exit, config_values, pop_bus_settings, run_until_signalled
from bus.log import configure_logging
from trainer_svc.config import ServiceConfig
from trainer_svc.errors import ConfigError

_SECTIONS = ("engine", "algorithm", "collapse_guard")


def build_parser() -> argparse.ArgumentParser:
    summary = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(prog="python -m trainer_svc", description=summary)
    parser.add_argument("--config", type=Path, default=None, help="YAML or JSON file with ServiceConfig fields")
    add_config_flags(parser, ServiceConfig, skip={*_SECTIONS, "bus"}, repeat={"resource_ids": "--resource-id"})
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="an engine, algorithm or collapse_guard field, e.g. engine.learning_rate=1e-4 (repeat)")
    add_bus_flags(parser)
    return parser


def _file_values(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config={str(path)!r}: must hold a mapping, got {type(loaded).__name__}")
    return loaded


def _set(data: dict[str, Any], item: str) -> None:
    """`--set SECTION.FIELD=VALUE`, the value read as YAML."""
    key, sep, raw = item.partition("=")
    section, dot, name = key.partition(".")
    if not sep or not dot or section not in _SECTIONS:
        raise ConfigError(f"--set {item!r}: must be SECTION.FIELD=VALUE with SECTION in {_SECTIONS}")
    data.setdefault(section, {})[name] = yaml.safe_load(raw)


def parse_config(argv: list[str] | None = None) -> ServiceConfig:
    parser = build_parser()
    values: dict[str, Any] = vars(parser.parse_args(argv))
    path, overrides = values.pop("config"), values.pop("overrides")

    def build() -> ServiceConfig:
        bus = pop_bus_settings(values, client_id="trainer")
        data = {**_file_values(path), **config_values(ServiceConfig, values)}
        for item in overrides:
            _set(data, item)
        return ServiceConfig.from_mapping(data, bus=bus)

    return build_or_exit(parser, build, (ConfigError, BusError, OSError, yaml.YAMLError, ValueError))


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    configure_logging("trainer", config.log_level)
    from transformers.utils import logging as hf_logging  # torch and transformers load after the config is valid

    from trainer_svc.service import run_service

    hf_logging.disable_progress_bar()  # a service logs lines, not progress bars of each checkpoint write
    return run_until_signalled(lambda stop: run_service(config, stop))

if __name__ == "__main__":
    sys.exit(main())
