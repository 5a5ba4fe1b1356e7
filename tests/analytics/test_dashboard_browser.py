"""`sflow dashboard` in a real headless browser (Debian's chromium, driven by selenium through chromedriver).

A run's store is filled through the sink's writer with the events of a small run (two resources taking
turns at rollout and training, multi-turn sessions whose calls span a weight update, one call that
drifted, two train steps); the dashboard is started as the CLI starts it, on that run. The page must show
the numbers a direct query of the store gives, draw a session's prefix tree with its tokens' versions, and
follow the store as it grows while the "sink" (this test, holding the chdb folder) writes more: the live
case, where the dashboard reads snapshots. A screenshot is written and checked to be a real PNG.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bus.ports import free_port
from bus.process import ManagedProcess
from infra.analytics.config import AnalyticsConfig, open_store
from infra.analytics.errors import AnalyticsError
from infra.analytics.store import ChdbStore
from schemas import events as ev
from tests.analytics.analytics_helpers import T0, ingest, llm_call, segment, timeline, train_completed
from tests.system_packages import require

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]
CHROMIUM = {"chromium": "chromium", "chromedriver": "chromium-driver"}
WAIT_S = 30.0
T = TypeVar("T")


def session_events(name: str, agent: str, turns: list[list[ev.Segment]], reward: float, at_ms: int,
                   drift_turn: int = -1) -> list[ev.Event]:
    """One session as the proxy and the processor record it: its calls (each extending the previous one's
    prompt + output, except a drifted one), its end, and its trajectory."""
    calls: list[ev.LLMCall] = []
    context = 12
    for turn, segments in enumerate(turns):
        parent = "" if not calls or turn == drift_turn else calls[-1].call_id
        call = llm_call(name, agent, segments, drift=turn == drift_turn, prompt=context, ts_ms=at_ms + turn,
                        call_id=f"{name}-c{turn}", turn=turn, parent_call_id=parent, task_id=f"task-{name}",
                        group_id=f"g-{name}")
        calls.append(call)
        context += sum(s.num_tokens for s in segments) + 7  # the tool's answer: 7 prompt tokens
    versions = [s.weight_version for segs in turns for s in segs]
    return [
        *calls,
        ev.SessionEnded(session_id=name, agent_id=agent, reward=reward, num_calls=len(calls), ts_ms=at_ms + 50,
                        correlation_id=name),
        ev.Trajectory(trajectory_id=f"t-{name}", session_id=name, agent_id=agent, reward=reward,
                      status="completed", call_ids=tuple(c.call_id for c in calls), min_version=min(versions),
                      max_version=max(versions), tokens_in_calls=sum(len(c.prompt_ids) + len(c.output_ids)
                                                                    for c in calls),
                      tokens_in_tree=context, drift_calls=int(drift_turn >= 0), ts_ms=at_ms + 60,
                      task_id=f"task-{name}", group_id=f"g-{name}", correlation_id=f"g-{name}"),
    ]


def first_run() -> list[ev.Event]:
    s = 1000
    return [
        *timeline("r0", [(0, "rollout"), (8, "train"), (11, "weight_sync"), (12, "rollout")]),
        *timeline("r1", [(0, "rollout"), (11, "weight_sync"), (12, "rollout")]),
        *session_events("s-a", "calc", [[segment("r0", 0, 30, T0, T0 + 2 * s)],
                                        [segment("r0", 0, 10, T0 + 6 * s, T0 + 8 * s),
                                         segment("r1", 1, 14, T0 + 12 * s, T0 + 13 * s, start=10)]], 1.0, T0 + 13 * s),
        *session_events("s-b", "calc", [[segment("r1", 0, 40, T0 + s, T0 + 4 * s, finish="length")]], 0.0,
                        T0 + 4 * s),
        *session_events("s-c", "search", [[segment("r1", 0, 20, T0 + 2 * s, T0 + 3 * s)],
                                          [segment("r1", 1, 25, T0 + 13 * s, T0 + 14 * s)]], 0.5, T0 + 14 * s,
                        drift_turn=1),
        train_completed(1, 1, histogram=(60, 40, 0), trajectories=("t-s-b",), reward=0.25, loss=0.4),
        train_completed(2, 2, histogram=(45, 30, 0), trajectories=("t-s-a", "t-s-c"), reward=0.75, loss=0.2),
    ]


def later_events() -> list[ev.Event]:
    return [
        *session_events("s-d", "calc", [[segment("r0", 2, 33, T0 + 20_000, T0 + 22_000)]], 1.0, T0 + 22_000),
        train_completed(3, 3, histogram=(33, 0, 0), trajectories=("t-s-d",), reward=0.875, loss=0.1),
        ev.MetricSample(service="trainer", name="eval/accuracy", value=0.625, ts_ms=T0 + 23_000),
    ]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs") / "dash-20250101-120000"
    with ChdbStore(root / "analytics" / "chdb") as store:
        ingest(store, first_run())
    return root


@pytest.fixture(scope="module")
def dashboard(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = ManagedProcess("infra.cli", ["dashboard", "--run", str(run_dir), "--port", str(port), "--refresh-s", "0.5"],
                          cwd=REPO, env={"PYTHONPATH": str(REPO)}, name="dashboard",
                          log=tmp_path_factory.mktemp("logs") / "dashboard.log")
    proc.start()
    try:
        proc.wait_healthy(f"http://127.0.0.1:{port}/api/panels", timeout_s=60)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = require(CHROMIUM)
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1700"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def when_free(open_it: Callable[[], T]) -> T:
    """Open the run's chdb folder once the dashboard lets go of it: it holds the folder for the length
    of each read (twice a second here)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return open_it()
        except AnalyticsError:  # held (StoreLockedError), or released between the refusal and the lock check
            assert time.monotonic() < deadline, "the dashboard never let go of the chdb folder"


def direct(run_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    with open_store(AnalyticsConfig(data_dir=run_dir / "analytics"), read_only=True) as store:
        return store.query(sql).rows


# The panels are redrawn on every refresh (twice a second here), so an element found by one WebDriver
# command may be gone by the next: every read of the page is one script, run between two redraws.
READ_ALL = """
const [css, names] = arguments;
return Array.from(document.querySelectorAll(css)).map(e =>
  names.map(n => n === "text" ? (e.innerText ?? e.textContent).trim() : e.getAttribute(n)));
"""


def read_all(driver: Any, css: str, *names: str) -> list[tuple[str | None, ...]]:
    """`names` ("text" or attribute names) of every element matching `css`, read at one instant."""
    return [tuple(row) for row in driver.execute_script(READ_ALL, css, list(names))]


def text_of(driver: Any, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException

    rows = read_all(driver, css, "text")
    if not rows:
        raise NoSuchElementException(css)
    return str(rows[0][0])


def wait_for(driver: Any, condition: Any, what: str) -> Any:
    from selenium.common.exceptions import NoSuchElementException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=(NoSuchElementException,)).until(
        condition, f"page never showed {what}; status: {text_of(driver, '#status')!r}")


def test_page_shows_the_runs_numbers_and_a_session_tree(browser: Any, dashboard: str, run_dir: Path,
                                                         tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(dashboard)
    wait_for(browser, lambda d: text_of(d, "#stat-trajectories") not in ("", "\N{EN DASH}"), "the stats")
    [(trajectories, calls, tokens, steps)] = direct(run_dir, """
        SELECT (SELECT count() FROM {db}.trajectories FINAL), (SELECT count() FROM {db}.llm_calls FINAL),
               (SELECT sum(num_tokens) FROM {db}.llm_call_segments FINAL),
               (SELECT count() FROM {db}.train_steps FINAL WHERE event_type = 'TrainStepCompleted')""")
    [(last_reward,)] = direct(run_dir, "SELECT argMax(reward_mean, step) FROM {db}.train_steps FINAL "
                                       "WHERE event_type = 'TrainStepCompleted'")
    assert (trajectories, calls, steps, last_reward) == (3, 5, 2, 0.75)  # what first_run() recorded
    assert text_of(browser, "#stat-trajectories") == str(trajectories)
    assert text_of(browser, "#stat-calls") == str(calls)
    assert text_of(browser, "#stat-tokens") == str(tokens)
    assert text_of(browser, "#stat-steps") == str(steps)
    assert text_of(browser, "#stat-last-reward") == str(last_reward)

    # Every panel drew from the store: one Gantt bar per activity transition, one length bin per call
    # length, drift counted for the agent that drifted, and no eval series yet.
    [(transitions,)] = direct(run_dir, "SELECT count() FROM {db}.scheduler_events FINAL WHERE kind = 'tag'")
    assert len(read_all(browser, "#gantt-svg rect[data-activity]", "data-activity")) == transitions == 7
    assert {a for (a,) in read_all(browser, "#gantt-svg rect", "data-activity")} == {"rollout", "train", "weight_sync"}
    assert text_of(browser, "#panel-eval") == "no eval events"
    drift_rows = [str(text).split() for (text,) in read_all(browser, "#panel-drift tr", "text")[1:]]
    assert drift_rows == [["search", "2", "1", "0.5", "1", "1"], ["calc", "3", "0", "0", "2", "0"]]
    assert read_all(browser, "#panel-throughput polyline", "points")
    assert read_all(browser, "#panel-staleness rect", "height")

    # The session view: pick the two-turn session whose second call spans the weight update.
    Select(browser.find_element(By.ID, "trajectory-select")).select_by_value("t-s-a")
    wait_for(browser, lambda d: "session s-a " in text_of(d, "#session-head"), "session s-a")
    nodes = read_all(browser, "#session g.call", "data-call-id", "data-versions", "text")
    segments = direct(run_dir, """
        SELECT call_id, arrayStringConcat(groupArray(concat(toString(version), 'x', toString(num_tokens))), ' ')
        FROM (SELECT * FROM {db}.llm_call_segments FINAL WHERE session_id = 's-a' ORDER BY segment_index)
        GROUP BY call_id ORDER BY call_id""")
    assert [(call_id, versions) for call_id, versions, _ in nodes] == segments \
        == [("s-a-c0", "0x30"), ("s-a-c1", "0x10 1x14")]
    assert "+7 prompt" in str(nodes[1][2])  # its prompt (49) extends its parent's 12 + 30 by the tool's 7 tokens
    assert {v for (v,) in read_all(browser, "#session .version-run", "data-version")} == {"0", "1"}

    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">I", header[16:20]) == (1400,)  # the IHDR width: the window's


def test_page_follows_a_live_store(browser: Any, dashboard: str, run_dir: Path) -> None:
    """The sink of a live run holds the chdb folder: the dashboard reads snapshots, and the page shows the
    rows written since it loaded without a reload."""
    browser.get(dashboard)
    wait_for(browser, lambda d: text_of(d, "#stat-trajectories") == "3", "the first trajectories")
    with when_free(lambda: ChdbStore(run_dir / "analytics" / "chdb")) as store:
        ingest(store, later_events())
        wait_for(browser, lambda d: text_of(d, "#stat-trajectories") == "4", "the new trajectory")
        wait_for(browser, lambda d: text_of(d, "#stat-last-reward") == "0.875", "the new train step")
        wait_for(browser, lambda d: "eval/accuracy" in text_of(d, "#panel-eval"), "the eval series")
