"""`python -m trainer_svc --run-id R --base-model-dir DIR --weights-root DIR [--mode standalone ...]`: parse
config -> build -> run.

Settings come from `--config FILE` (YAML or JSON: the `ServiceConfig` fields, with `engine:` and
`algorithm:` sections), then the flags below (each scalar `ServiceConfig` field; `--resource-id`
repeats), then `--set SECTION.FIELD=VALUE` for engine/algorithm fields (`--set engine.learning_rate=1e-4`;
the value is read as YAML). Kafka comes from `--bootstrap-servers` / `--topic-prefix` or the environment
(SFLOW_BOOTSTRAP, SFLOW_TOPIC_PREFIX, SFLOW_REPLICATION). SIGTERM / SIGINT stop the service after the
step in hand; a restart resumes from the newest checkpoint under `<weights-root>/<run-id>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from bus.config import BusConfig
from bus.errors import BusError
from bus.log import configure_logging
from trainer_svc.config import ServiceConfig
from trainer_svc.errors import ConfigError

_NOT_FLAGS = {"engine", "algorithm", "bus", "resource_ids"}
_SECTIONS = ("engine", "algorithm")


def build_parser() -> argparse.ArgumentParser:
    summary = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(prog="python -m trainer_svc", description=summary)
    parser.add_argument("--config", type=Path, default=None, help="YAML or JSON file with ServiceConfig fields")
    docs = _field_docs()
    for f in dataclasses.fields(ServiceConfig):
        if f.name in _NOT_FLAGS:
            continue
        default = "required" if f.default is dataclasses.MISSING else f.default
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=argparse.SUPPRESS,
                            help=f"{docs.get(f.name, '')} (default: {default})")
    parser.add_argument("--resource-id", dest="resource_ids", action="append", default=argparse.SUPPRESS,
                        help="a resource this trainer runs on (repeat for several; default: trainer-0)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="an engine or algorithm field, e.g. engine.learning_rate=1e-4 (repeat)")
    parser.add_argument("--bootstrap-servers", default=None, help="Kafka brokers (default: $SFLOW_BOOTSTRAP)")
    parser.add_argument("--topic-prefix", default=None, help="topic prefix (default: $SFLOW_TOPIC_PREFIX or sf.)")
    return parser


def _field_docs() -> dict[str, str]:
    """First sentence of each field's docstring in config.py (argparse help)."""
    import ast
    import inspect

    source = inspect.getsource(ServiceConfig)
    body = ast.parse(source).body[0]
    docs: dict[str, str] = {}
    assert isinstance(body, ast.ClassDef)
    for node, nxt in zip(body.body, body.body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr):
            text = getattr(nxt.value, "value", "")
            if isinstance(text, str):
                docs[node.target.id] = " ".join(text.split()).split(". ")[0].replace("%", "%%")
    return docs


def _scalar(name: str, value: str) -> Any:
    """Flag values are read as YAML scalars (`none` -> None, `3` -> 3), except free-text fields."""
    if name in ("run_id", "base_model_dir", "weights_root", "model_name"):
        return value
    parsed = yaml.safe_load(value)
    return None if isinstance(parsed, str) and parsed.lower() == "none" else parsed


def parse_config(argv: list[str] | None = None) -> ServiceConfig:
    parser = build_parser()
    values: dict[str, Any] = vars(parser.parse_args(argv))
    path, overrides = values.pop("config"), values.pop("overrides")
    bootstrap, prefix = values.pop("bootstrap_servers"), values.pop("topic_prefix")
    try:
        data: dict[str, Any] = {}
        if path is not None:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"config={str(path)!r}: must hold a mapping, got {type(loaded).__name__}")
            data = loaded
        for name, value in values.items():
            data[name] = value if name == "resource_ids" else _scalar(name, value)
        for item in overrides:
            key, sep, raw = item.partition("=")
            section, dot, name = key.partition(".")
            if not sep or not dot or section not in _SECTIONS:
                raise ConfigError(f"--set {item!r}: must be SECTION.FIELD=VALUE with SECTION in {_SECTIONS}")
            data.setdefault(section, {})[name] = yaml.safe_load(raw)
        env_bus = BusConfig.from_env(client_id="trainer")
        bus = BusConfig(bootstrap_servers=bootstrap or env_bus.bootstrap_servers,
                        topic_prefix=env_bus.topic_prefix if prefix is None else prefix,
                        client_id="trainer", replication_factor=env_bus.replication_factor)
        return ServiceConfig.from_mapping(data, bus=bus)
    except (ConfigError, BusError, OSError, yaml.YAMLError, TypeError, ValueError) as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    configure_logging("trainer", config.log_level)
    from transformers.utils import logging as hf_logging  # torch and transformers load after the config is valid

    from trainer_svc.service import run_service

    hf_logging.disable_progress_bar()  # a service logs lines, not progress bars of each checkpoint write

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run_service(config, stop)


if __name__ == "__main__":
    sys.exit(main())
