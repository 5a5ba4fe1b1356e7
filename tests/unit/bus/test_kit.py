"""The service kit: config -> flags -> the same config; bad values name the field; bus settings; signals."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from bus.config import BusConfig
from bus.kit import (
    ConfigModel,
    FlagError,
    add_bus_flags,
    add_config_flags,
    build_or_exit,
    bus_settings,
    config_values,
    pop_bus_settings,
    run_until_signalled,
)

pytestmark = pytest.mark.unit


class KitError(ValueError):
    pass


class Section(ConfigModel):
    config_error = KitError
    field_prefix = "section."

    rate: float = Field(default=0.1, gt=0)
    """Learning rate."""


class Example(ConfigModel):
    config_error = KitError

    name: str
    """Who runs (required)."""
    count: int = Field(default=2, ge=1)
    """How many at 100% load."""
    limit: float | None = None
    """Optional bound; none = unbounded."""
    path: Path | None = None
    """Where it writes."""
    mode: Literal["fast", "slow"] = "fast"
    """How it goes."""
    verbose: bool = False
    """Log more."""
    tags: tuple[str, ...] = ()
    """Labels."""
    section: Section = Field(default_factory=Section)
    """A nested section (no flag)."""


def parser_of() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="example")
    add_config_flags(parser, Example, skip={"section"}, repeat={"tags": "--tag"})
    return parser


def parse(argv: list[str]) -> Example:
    return Example(**config_values(Example, vars(parser_of().parse_args(argv))))


def test_flags_round_trip_a_config(tmp_path: Path) -> None:
    want = Example(name="a", count=5, limit=2.5, path=tmp_path / "x", mode="slow", verbose=True, tags=("p", "q"))
    argv = ["--name", "a", "--count", "5", "--limit", "2.5", "--path", str(tmp_path / "x"), "--mode", "slow",
            "--verbose", "--tag", "p", "--tag", "q"]
    assert parse(argv) == want
    assert parse(["--name", "b"]) == Example(name="b")


def test_none_unsets_an_optional_field_only() -> None:
    assert parse(["--name", "a", "--limit", "none", "--path", "None"]).limit is None
    assert parse(["--name", "none"]).name == "none"  # a str field takes the word as it is


def test_help_comes_from_the_field_docs() -> None:
    text = parser_of().format_help()
    assert "How many at 100% load. (default: 2)" in text and "Who runs (required). (required)" in text
    assert "--no-verbose" in text and "--tag" in text and "--section" not in text


@pytest.mark.parametrize(("argv", "named"), [
    (["--name", "a", "--count", "many"], "count='many'"),
    (["--name", "a", "--count", "0"], "count=0"),
    (["--name", "a", "--mode", "medium"], "mode='medium'"),
])
def test_a_bad_value_names_the_field_and_the_value(argv: list[str], named: str) -> None:
    with pytest.raises((FlagError, KitError), match=named):
        parse(argv)


def test_strict_models_refuse_strings_and_unknown_keys() -> None:
    with pytest.raises(KitError, match=r"^count='3': "):
        Example(name="a", count="3")  # type: ignore[arg-type]
    with pytest.raises(KitError, match="typo=1: unknown field"):
        Example(name="a", typo=1)  # type: ignore[call-arg]
    with pytest.raises(KitError, match="name: required"):
        Example()  # type: ignore[call-arg]
    with pytest.raises(KitError, match=r"^section\.rate=nan"):
        Section(rate=float("nan"))
    with pytest.raises(KitError, match=r"^section\.rate=0"):
        Example(name="a", section={"rate": 0})  # type: ignore[arg-type]


def test_build_or_exit_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    def build() -> Example:
        return parse(["--name", "a", "--count", "0"])

    with pytest.raises(SystemExit) as info:
        build_or_exit(parser_of(), build)
    assert info.value.code == 2 and "count=0" in capsys.readouterr().err


def test_bus_settings_take_flags_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFLOW_BOOTSTRAP", "10.0.0.1:9092")
    monkeypatch.setenv("SFLOW_TOPIC_PREFIX", "env.")
    monkeypatch.setenv("SFLOW_REPLICATION", "3")
    assert bus_settings("svc") == BusConfig("10.0.0.1:9092", "env.", "svc", 3)
    assert bus_settings("svc", "h:1", "") == BusConfig("h:1", "", "svc", 3)
    parser = argparse.ArgumentParser()
    add_bus_flags(parser)
    values = vars(parser.parse_args(["--topic-prefix", "f."]))
    assert pop_bus_settings(values, "svc") == BusConfig("10.0.0.1:9092", "f.", "svc", 3) and values == {}


def test_run_until_signalled_sets_stop_and_restores_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)

    def run(stop: threading.Event) -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        return "stopped"

    assert run_until_signalled(run) == "stopped"
    assert signal.getsignal(signal.SIGTERM) is before
