"""A stock mini-swe-agent (`DefaultAgent`, its own `mini.yaml` templates, `LitellmModel`: litellm's OpenAI
provider) through the capture proxy, on a trivial task in a scratch directory.

Pointed at the proxy as a user would, in its model config: `model_name: openai/<served model>` and
`model_kwargs` with `api_base`, `api_key` and the session header (`extra_headers`, which litellm sends as
they are), or, as a config with no headers would, the session in the base path (`api_base:
<proxy>/sessions/<id>/v1`, the proxy's per-session base path). Its HTTP exchanges are seen through
litellm's own client hook (`litellm.client_session`). The agent's commands would run in its
`LocalEnvironment` (a subprocess in the scratch directory, no sandbox): with `tool_choice` auto the
random model never writes a parseable `bash` call, so each step is a format error the agent answers with
its guidance message until `max_consecutive_format_errors` ends the run. It does not send back a reply
that held no tool call, so every call after the first is a fresh prompt (no assistant turn: no parent,
and no drift). What the proxy guarantees is checked by `support.served_and_recorded`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

import litellm
import pytest
import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

from tests.adapter.test_adapter_service import Proxy
from tests.frameworks.support import KEY, Exchanges, ThroughProxy

pytestmark = [pytest.mark.frameworks, pytest.mark.kafka]


def driver(session: str, workdir: Path, monkeypatch: pytest.MonkeyPatch, in_path: bool,
           ) -> Callable[[Proxy, Exchanges], str]:
    def drive(proxy: Proxy, exchanges: Exchanges) -> str:
        monkeypatch.setattr(litellm, "client_session", exchanges.client())
        where = ({"api_base": f"{proxy.url}/sessions/{session}/v1"} if in_path else
                 {"api_base": f"{proxy.url}/v1", "extra_headers": {"X-Session-Id": session}})
        config = yaml.safe_load((files("minisweagent") / "config" / "mini.yaml").read_text())
        model = LitellmModel(
            model_name=f"openai/{proxy.model}", cost_tracking="ignore_errors",
            **(config["model"] | {"model_kwargs": config["model"]["model_kwargs"] | {
                "api_key": KEY, "max_tokens": 64, "num_retries": 0} | where}))
        agent_config = {k: v for k, v in config["agent"].items() if k != "mode"}  # mode: the interactive agent's
        agent = DefaultAgent(model, LocalEnvironment(cwd=str(workdir), timeout=5),
                             **(agent_config | {"step_limit": 3, "max_consecutive_format_errors": 3}))
        result = agent.run("Print the word hello.")
        return f"agent ended: {result.get('exit_status')}"

    return drive


@pytest.mark.parametrize("in_path", [False, True], ids=["session-header", "session-base-path"])
def test_mini_swe_agent_through_the_proxy(through_proxy: ThroughProxy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          in_path: bool) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    session = f"mini-swe-{in_path}"
    run = through_proxy(session,
                              driver(session, workdir, monkeypatch, in_path))
    assert all(("/sessions/" in a.path) == in_path for a in run.exchanges)
    assert len(run.calls) >= 2
    assert all(a.request["tools"][0]["function"]["name"] == "bash" for a in run.exchanges)
