"""The dashboard's server without a browser: a run whose store does not exist yet answers 503 with the reason
(the page shows it and keeps polling), an unknown trajectory is a 404, and the prefix tree puts each call
under the call its prompt extends, a drifted call (or one whose parent is not in the trajectory) at a root."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from infra.analytics.config import AnalyticsConfig
from infra.analytics.store import ChdbStore
from infra.dashboard.app import create_app, finite
from infra.dashboard.config import DashboardConfig
from infra.dashboard.errors import DashboardConfigError
from infra.dashboard.panels import prefix_tree
from tests.analytics.analytics_helpers import ingest, llm_call, segment

pytestmark = pytest.mark.unit


def client(data_dir: Path) -> TestClient:
    return TestClient(create_app(DashboardConfig(store=AnalyticsConfig(data_dir=data_dir), title="run <1>")))


def test_a_store_not_written_yet_is_a_503_naming_the_folder(tmp_path: Path) -> None:
    with client(tmp_path / "analytics") as c:
        answer = c.get("/api/panels")
        assert answer.status_code == 503
        assert f"no analytics data at {tmp_path / 'analytics' / 'chdb'}" in answer.json()["detail"]
        page = c.get("/")
        assert page.status_code == 200 and "<h1 id=\"run-title\">run &lt;1&gt;</h1>" in page.text
        assert c.get("/dashboard.js").headers["content-type"].startswith("text/javascript")


def test_an_unknown_trajectory_is_a_404_and_panels_answer(tmp_path: Path) -> None:
    with ChdbStore(tmp_path / "analytics" / "chdb") as store:
        ingest(store, [llm_call("s0", "a", [segment("r0", 0, 4, 1_700_000_000_000, 1_700_000_000_100)])])
    with client(tmp_path / "analytics") as c:
        assert c.get("/api/session/nope").status_code == 404
        panels = c.get("/api/panels").json()
        assert panels["summary"]["llm_calls"] == 1 and panels["summary"]["newest_version"] is None
        assert panels["eval"] == {"series": {}}


def test_prefix_tree_nests_calls_and_keeps_version_runs() -> None:
    def call(call_id: str, parent: str, prompt: int, output: int) -> dict[str, object]:
        return {"call_id": call_id, "parent_call_id": parent, "prompt_tokens": prompt, "output_tokens": output}

    calls = [call("a", "", 10, 5), call("b", "a", 18, 4), call("c", "b", 25, 2), call("d", "", 30, 3),
             call("e", "elsewhere", 9, 1), call("f", "a", 16, 2)]
    segments = [{"call_id": "b", "start": 0, "num_tokens": 1, "version": 0},
                {"call_id": "b", "start": 1, "num_tokens": 3, "version": 1}]
    tree = prefix_tree(calls, segments)
    assert [(n["call_id"], n["depth"], n["new_prompt_tokens"]) for n in tree] == [
        ("a", 0, 10), ("b", 1, 3), ("c", 2, 3), ("f", 1, 1), ("d", 0, 30), ("e", 0, 9)]
    assert tree[1]["versions"] == [[0, 1, 0], [1, 3, 1]] and tree[0]["versions"] == []


def test_config_names_the_bad_field_and_json_has_no_nan(tmp_path: Path) -> None:
    with pytest.raises(DashboardConfigError, match="refresh_s"):
        DashboardConfig(store=AnalyticsConfig(data_dir=tmp_path), refresh_s=0.0)
    assert finite({"a": [float("nan"), 1.5, float("inf")], "b": "x"}) == {"a": [None, 1.5, None], "b": "x"}
