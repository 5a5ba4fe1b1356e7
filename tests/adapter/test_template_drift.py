"""Every chat template `trl` ships that renders tool calls, through the proxy's token-in/token-out path
(bench/template_drift.py drives it and prints the table of docs/models.md): each is either refused by the
proxy's start-up probe (TemplateError: it never serves prompts the template would not give) or every
prompt of its multi-turn tool sessions continues the previous prompt + output ids (continuation or
realigned) and the edited history is a fork. Qwen templates run with Qwen3's or Qwen3.5's real vocabulary,
Llama 3.x with Llama 3.1's, the others with the byte tokenizer."""

from __future__ import annotations

import pytest

from agents_adapter.proxy.tito import CONTINUATION, FORK, REALIGNED
from bench import template_drift

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def rows() -> list[template_drift.Row]:
    names = [n for n in template_drift.template_names() if template_drift.renders_tool_calls(n)]
    return [template_drift.drift_row(n) for n in names]


def test_every_tool_template_is_served_exactly_or_refused(rows: list[template_drift.Row]) -> None:
    print("\n" + template_drift.table(rows))
    assert len(rows) >= 25  # trl 1.16 ships 28 that render tool calls
    assert [(r.template, r.violations) for r in rows if r.violations] == []
    for row in rows:
        if row.outcome == "served":
            assert row.classes[FORK] == 1 and row.classes["first"] == 3  # one edit, three sessions
            assert row.classes[CONTINUATION] + row.classes[REALIGNED] == 6
        else:
            assert row.outcome.startswith("refused")


def test_the_real_families_are_served_with_their_vocabularies(rows: list[template_drift.Row]) -> None:
    served = {r.template: r for r in rows if r.outcome == "served"}
    for name in ("qwen2_5", "qwen3", "qwen3_instruct_2507", "llama3_1", "llama3_2"):
        assert name in served and served[name].calls_parsed
        assert served[name].tokenizer == ("llama3" if name.startswith("llama") else "qwen3")
    for name in ("qwen3_5_think", "qwen3_5_nothink", "qwen3_6"):  # XML-style calls: the proxy parses none
        assert name in served and served[name].tokenizer == "qwen3_5"
    assert served["qwen3"].classes[REALIGNED] > 0  # Qwen3 drops earlier think blocks: realigned, not forked
    assert served["qwen2_5"].classes[REALIGNED] == served["llama3_1"].classes[REALIGNED] == 0


def test_templates_that_need_mapping_arguments_are_probed() -> None:
    """LFM2.5 (and Qwen3.5+, GLM-4, Nemotron 3) raise on JSON-string arguments, Qwen2.5 and Llama 3.1 would
    write them JSON-encoded twice: the codec gives them mappings; Qwen3 writes a string as it is."""
    for name in ("lfm2_2_5", "qwen2_5", "llama3_1"):
        assert template_drift.codec_for(name).arguments_as_mapping, name
    assert not template_drift.codec_for("qwen3").arguments_as_mapping
