"""The service kit: what every `python -m SERVICE` program does the same way, written once.

A service's `__main__` is: build a parser from its pydantic config, parse, build the config (exit 2 with
the field and the bad value named), then run until SIGINT/SIGTERM. The pieces:

- `ConfigModel`: the base of a strict config tree (frozen, unknown keys refused, no NaN/inf) whose
  construction raises the package's own `ConfigError` with `field=value: problem` messages, the nested
  field dotted (`engine.zero_stage=3: ...`). Field help comes from the field's `description` or its
  attribute docstring.
- `add_config_flags(parser, Model)`: one `--field-name` flag per field, help from the description;
  bools are `--x/--no-x`; `repeat={"field": "--flag"}` makes a repeatable flag for a tuple field.
- `config_values(Model, values)`: the parsed strings typed by each field's annotation; `none` (or '')
  given to an optional field means None (`--max-staleness none`). A value that cannot be typed raises
  `FlagError` naming the field and the value.
- `add_bus_flags` / `bus_settings`: `--bootstrap-servers` / `--topic-prefix`, each falling back on the
  environment the launcher sets (SFLOW_BOOTSTRAP, SFLOW_TOPIC_PREFIX, SFLOW_REPLICATION).
- `build_or_exit(parser, build, errors)`: a config error becomes argparse's usage error (exit status 2).
- `run_until_signalled(run)`: runs `run(stop)` with SIGINT/SIGTERM setting `stop` (the service finishes
  the batch or step in hand, then returns).

Elsewhere in `bus/`: the one consumer loop is `bus.consumer.EventConsumer.run`, the managed child process
`bus.process.ManagedProcess`, retries with backoff `bus.retry`, dead letters `bus.deadletter.dead_letter`.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import threading
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from bus.config import BusConfig
from bus.errors import BusError

T = TypeVar("T")
# The metrics port of a process without HTTP (1..65535; None: no metrics) and the address it listens on.
MetricsPort = Annotated[int | None, Field(ge=1, le=65535)]
MetricsHost = Annotated[str, Field(min_length=1)]
NONE_WORDS = ("none", "")
BUS_FLAGS = ("bootstrap_servers", "topic_prefix")


class FlagError(BusError, ValueError):
    """A command-line value does not fit its field's type (the message names the field and the value)."""


def describe_errors(error: ValidationError, prefix: str = "") -> str:
    """One `field=value: problem` per pydantic error, `; `-joined; nested fields dotted, `prefix` first
    (`engine.` for a section built alone), unknown keys said as such."""
    lines = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        message = "unknown field" if item["type"] == "extra_forbidden" else str(item["msg"])
        message = message.removeprefix("Value error, ")
        name = prefix + ".".join(loc)
        if not loc:
            lines.append(message)  # a check across fields: its message names them
        elif item["type"] == "missing":
            lines.append(f"{name}: required")
        elif message.startswith(f"{loc[-1]}="):  # a validator's own `field=value` message
            lines.append(name.removesuffix(loc[-1]) + message)
        else:
            lines.append(f"{name}={item.get('input')!r}: {message}")
    return "; ".join(lines)


class ConfigModel(BaseModel):
    """A strict, frozen config section: values must have their field's type (a YAML `"3"` is not 3),
    unknown keys and non-finite numbers are refused, and a bad value raises `config_error` (the owning
    package's `ConfigError`) naming `field_prefix + field` and the value.

    Attribute docstrings are the field descriptions, so the CLI help and the code say the same thing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False,
                              use_attribute_docstrings=True, arbitrary_types_allowed=True)
    config_error: ClassVar[type[Exception]] = ValueError
    field_prefix: ClassVar[str] = ""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise self.config_error(describe_errors(e, self.field_prefix)) from e

    # Tells pydantic to validate a nested section as plain data, not through this __init__: its errors
    # then reach the outer model with their dotted location, not wrapped in a ValueError.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


# --- config -> command line ---------------------------------------------------------------------------


def _help(field: FieldInfo) -> str:
    text = " ".join((field.description or "").split())
    if field.is_required():
        text += " (required)"
    elif field.default_factory is None:
        text += f" (default: {field.default})"
    return text.replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser, model: type[BaseModel], *, skip: Collection[str] = (),
                     repeat: Mapping[str, str] | None = None, required: bool = False) -> None:
    """One flag per field of `model` (except `skip`); a flag not given leaves the field's default.

    `repeat` maps a tuple field to its repeatable flag (`{"capabilities": "--capability"}`); `required`
    makes argparse itself refuse a missing required field (for configs built from flags alone).
    """
    repeat = repeat or {}
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        if name in repeat:
            parser.add_argument(repeat[name], dest=name, action="append", default=argparse.SUPPRESS,
                                help=_help(field) + " (repeat for several)")
        elif field.annotation is bool:
            parser.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS,
                                action=argparse.BooleanOptionalAction, help=_help(field))
        else:
            parser.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS,
                                required=required and field.is_required(), help=_help(field))


def is_optional(annotation: Any) -> bool:
    """Whether None is one of the values a field may take (`int | None`, `Optional[Path]`)."""
    origin = typing.get_origin(annotation)
    return (origin is typing.Union or origin is types.UnionType) and type(None) in typing.get_args(annotation)


def flag_value(model: type[BaseModel], name: str, raw: Any) -> Any:
    """A command-line value typed by the field's annotation (its constraints are the model's to check)."""
    field = model.model_fields[name]
    if isinstance(raw, str) and raw.lower() in NONE_WORDS and is_optional(field.annotation):
        return None
    if not isinstance(raw, str | list):
        return raw  # a flag argparse typed already (a bool)
    try:
        return TypeAdapter(typing.cast(Any, field.annotation)).validate_python(raw, strict=False)
    except ValidationError as e:
        raise FlagError(f"{name}={raw!r}: {e.errors()[0]['msg']}") from e


def config_values(model: type[BaseModel], values: Mapping[str, Any], raw: Collection[str] = ()) -> dict[str, Any]:
    """The parsed flags of `model`'s fields typed (`none` -> None for optional ones); other names, and the
    fields in `raw` (which the service's own builder parses), unchanged."""
    return {name: flag_value(model, name, value) if name in model.model_fields and name not in raw else value
            for name, value in values.items()}


def add_bus_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", default=None, help="Kafka brokers (default: $SFLOW_BOOTSTRAP)")
    parser.add_argument("--topic-prefix", default=None, help="topic prefix (default: $SFLOW_TOPIC_PREFIX or sf.)")


def bus_settings(client_id: str, bootstrap_servers: str | None = None, topic_prefix: str | None = None) -> BusConfig:
    """The bus of a service: the flags where given (an empty prefix is a prefix), else the environment."""
    env = BusConfig.from_env(client_id=client_id)
    return dataclasses.replace(env, bootstrap_servers=bootstrap_servers or env.bootstrap_servers,
                               topic_prefix=env.topic_prefix if topic_prefix is None else topic_prefix)


def pop_bus_settings(values: dict[str, Any], client_id: str) -> BusConfig:
    """`bus_settings` from the `add_bus_flags` values, which are taken out of `values`."""
    return bus_settings(client_id, values.pop("bootstrap_servers", None), values.pop("topic_prefix", None))


def build_or_exit(parser: argparse.ArgumentParser, build: Callable[[], T],
                  errors: tuple[type[Exception], ...] = (ValueError, BusError)) -> T:
    """`build()`, or argparse's usage error with the message (exit status 2) when it raises `errors`."""
    try:
        return build()
    except errors as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


# --- running ------------------------------------------------------------------------------------------


def run_until_signalled(run: Callable[[threading.Event], T],
                        signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM)) -> T:
    """`run(stop)` with each of `signals` setting `stop`; the previous handlers are back afterwards."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in signals}
    try:
        return run(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
