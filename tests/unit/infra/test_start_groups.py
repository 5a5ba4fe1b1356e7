"""The job's start order: consecutive inference engines start together, everything else one by one."""

from __future__ import annotations

import pytest

from infra.demo import start_groups
from infra.launcher import ServiceSpec

pytestmark = pytest.mark.unit


def names(*services: str) -> list[ServiceSpec]:
    return [ServiceSpec(name, "module", ()) for name in services]


def test_consecutive_engines_form_one_group_and_the_rest_keep_their_order() -> None:
    specs = names("analytics", "trajectories", "infer-r0", "infer-r1", "infer-r2", "scheduler", "adapter")
    assert [[s.name for s in group] for group in start_groups(specs)] == [
        ["analytics"], ["trajectories"], ["infer-r0", "infer-r1", "infer-r2"], ["scheduler"], ["adapter"]]


def test_engines_apart_are_not_merged() -> None:
    specs = names("infer-r0", "scheduler", "infer-r1")
    assert [[s.name for s in group] for group in start_groups(specs)] == [["infer-r0"], ["scheduler"], ["infer-r1"]]
