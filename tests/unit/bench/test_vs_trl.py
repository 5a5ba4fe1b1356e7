"""bench/vs_trl.py's plumbing: the demo's settings become TRL's, the shared reply score, the closing lines, and
the one held-out evaluator on a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from examples.calculator.agent import CalculatorAgent, DirectAgent, EpisodeResult
from infra.run_config import RunConfig
from tests.unit.bench.bench_modules import load_bench
from tests.unit.infra.run_configs import DEMO

pytestmark = pytest.mark.unit

vs_trl = load_bench("vs_trl")


def _config(steps: int = 6) -> RunConfig:
    return vs_trl.workload_config(RunConfig.load(DEMO), vs_trl.SINGLE, steps)


def test_the_demo_settings_become_trls_grpo_config(tmp_path: Path) -> None:
    from trl import GRPOConfig

    config = _config()
    settings = vs_trl.job_settings(config)
    args = GRPOConfig(**vs_trl.grpo_args(settings, tmp_path, save_every=3))
    assert args.num_generations == config.scheduler.samples_per_task
    assert args.generation_batch_size == args.per_device_train_batch_size == (
        config.scheduler.samples_per_task * config.scheduler.train_batch_groups)
    assert args.steps_per_generation == 1 and args.gradient_accumulation_steps == 1  # one update per step
    assert args.loss_type == "grpo"  # seq_mean_token_mean: per-sequence token mean, then the mean of sequences
    assert args.learning_rate == config.trainer.learning_rate and args.lr_scheduler_type == "constant"
    assert (args.epsilon, args.epsilon_high, args.beta) == (0.2, 0.2, 0.0)
    assert args.mask_truncated_completions is config.trainer.algorithm.overlong_mask
    assert (args.max_completion_length, args.temperature, args.max_steps) == (80, 1.0, 6)
    multi = vs_trl.job_settings(vs_trl.workload_config(RunConfig.load(DEMO), vs_trl.MULTI, 6))
    multi_args = GRPOConfig(**vs_trl.grpo_args(multi, tmp_path, save_every=3))
    assert (multi_args.max_completion_length, multi_args.max_tool_calling_iterations) == (80 * 3, 2)


def test_an_aggregation_trl_cannot_match_is_refused() -> None:
    data = _config().model_dump(mode="json")
    data["trainer"]["algorithm"]["aggregation"] = "seq_mean_token_sum"
    settings = vs_trl.job_settings(RunConfig.model_validate(data))
    with pytest.raises(ValueError, match="seq_mean_token_sum"):
        _ = settings.trl_loss_type


def test_the_single_turn_job_uses_the_direct_agent_and_the_correctness_reward() -> None:
    config = _config()
    assert config.example.agent == "examples.calculator.agent:DirectAgent"
    assert config.example.reward == "examples.calculator.reward:correct"
    assert (config.agent.max_turns, config.eval.enabled) == (1, False)
    request = DirectAgent("m")._request([{"role": "user", "content": "What is 1 + 2?"}])
    assert "tools" not in request and "tools" in CalculatorAgent("m")._request([])


class _Message:
    def __init__(self, content: str, tool_calls: list[Any] | None = None) -> None:
        self.content, self.tool_calls = content, tool_calls


def test_the_direct_agent_takes_one_reply_and_a_tool_call_answers_nothing() -> None:
    agent, result = DirectAgent("m"), EpisodeResult("s", "t")
    assert agent._observe(result, [], _Message("7")) is True
    assert (result.answer, result.answered, result.turns) == ("7", True, 1)
    called = EpisodeResult("s", "t")
    assert agent._observe(called, [], _Message("", tool_calls=[object()])) is True
    assert (called.answer, called.answered, called.tool_calls) == ("", False, 0)  # the tool is not run


def test_the_reply_score_is_the_verifier_and_a_tool_call_scores_nothing() -> None:
    assert vs_trl.reply_score("the answer is 12", 12.0) == 1.0
    assert vs_trl.reply_score("13", 12.0) == 0.0
    assert vs_trl.reply_score('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12"}}', 12.0) == 0.0


def _run(name: str, times: dict[int, float], accuracy: dict[int, float], wall_s: float) -> Any:
    return vs_trl.SystemRun(name, wall_s, {s: (Path(f"c{s}"), t) for s, t in times.items()}, samples=100,
                            tokens=1000, loop_s=10.0 if name == "TRL" else 20.0, accuracy=accuracy)


def test_the_closing_lines_compare_time_to_target_and_samples_per_second() -> None:
    trl = _run("TRL", {5: 10.0, 10: 20.0}, {5: 0.1, 10: 0.4}, wall_s=25.0)
    sflow = _run("SeamlessFlow", {5: 8.0, 10: 16.0}, {5: 0.3, 10: 0.5}, wall_s=30.0)
    assert (trl.time_to(0.3), sflow.time_to(0.3), sflow.time_to(0.9)) == (20.0, 8.0, None)
    assert vs_trl.ratio_lines(trl, sflow, 0.3, vs_trl.SINGLE) == [
        "ratio time-to-accuracy TRL / SeamlessFlow (single-turn): 2.50x",
        "ratio samples/s SeamlessFlow / TRL (single-turn): 0.50x"]
    lines = vs_trl.ratio_lines(trl, sflow, 0.45, vs_trl.SINGLE)  # TRL never reaches it: its wall time, said as a bound
    assert lines[0].startswith("note: TRL did not reach") and lines[-2].endswith(": 1.56x")


def test_the_evaluator_scores_greedy_replies_of_a_checkpoint(tmp_path: Path) -> None:
    from inference_svc.default_model import DefaultModelSpec, create_default_model

    model = create_default_model(tmp_path / "tiny", DefaultModelSpec(hidden_size=32, intermediate_size=64,
                                                                     num_hidden_layers=1, head_dim=8))
    rows = [{"question": "What is 1 + 2?", "answer": 3.0}, {"question": "What is 4 * 2?", "answer": 8.0}]
    evaluator = vs_trl.HeldOutEvaluator(model, rows, max_tokens=6)
    replies = evaluator.replies(model)
    assert len(replies) == 2 and replies == evaluator.replies(model)  # greedy: the same replies again
    assert all("<|im_end|>" not in r for r in replies)  # cut at the chat format's end
    assert evaluator.accuracy(model) == sum(vs_trl.reply_score(r, row["answer"])
                                            for r, row in zip(replies, rows, strict=True)) / 2


def test_trls_calculator_tool_has_the_agents_schema_and_runner() -> None:
    from transformers.utils import get_json_schema

    from examples.calculator.tool import CALCULATOR_TOOL
    from inference_svc.default_model import build_tokenizer

    schema = get_json_schema(vs_trl.calculator)
    assert {**schema, "function": {k: v for k, v in schema["function"].items() if k != "return"}} == CALCULATOR_TOOL
    tokenizer = build_tokenizer("byte", "chatml", 4096)
    prompt = vs_trl.prompt_of("What is 1 + 2?")
    assert (tokenizer.apply_chat_template(prompt, tools=[vs_trl.calculator], tokenize=False)
            == tokenizer.apply_chat_template(prompt, tools=[CALCULATOR_TOOL], tokenize=False))  # the same prompt
    assert vs_trl.calculator("2 * (3 + 4)") == "14"
    assert vs_trl.calculator("2 +").startswith("error")


def test_an_episode_is_read_from_a_conversation_as_the_agent_records_it() -> None:
    from examples.calculator.reward import shaped_reward
    from examples.calculator.tasks import ArithmeticTask

    call = [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "3 * 4"}}}]
    used = vs_trl.episode_of([{"role": "assistant", "content": "", "tool_calls": call},
                              {"role": "tool", "name": "calculator", "content": "12"},
                              {"role": "assistant", "content": "12"}])
    assert (used.turns, used.tool_calls, used.tool_errors, used.answer, used.last_tool_output) == (2, 1, 0, "12", "12")
    assert shaped_reward(used, ArithmeticTask("t", "What is 3 * 4?", 12.0)) == pytest.approx(1.0)
    failed = vs_trl.episode_of([{"role": "assistant", "content": "", "tool_calls": call},
                                {"role": "tool", "name": "calculator", "content": {"error": "bad"}}])
    assert (failed.tool_errors, failed.answered, failed.last_tool_output) == (1, False, "")
    assert shaped_reward(failed, ArithmeticTask("t", "What is 3 * 4?", 12.0)) == 0.0


def test_the_throughput_job_is_a_larger_untrained_model_with_fixed_length_replies(tmp_path: Path) -> None:
    from trl import GRPOConfig

    demo = RunConfig.load(DEMO)
    config = vs_trl.workload_config(demo, vs_trl.THROUGHPUT, 3)
    assert config.model.shape is not None and config.model.shape.hidden_size == 512
    assert (config.model.warmup_steps, config.agent.max_tokens, config.agent.ignore_eos) == (0, 256, True)
    assert not config.trainer.algorithm.dynamic_sampling and not config.trainer.algorithm.overlong_mask
    settings = vs_trl.job_settings(config)
    args = GRPOConfig(**vs_trl.grpo_args(settings, tmp_path, save_every=3))
    assert settings.workload == vs_trl.THROUGHPUT
    assert args.generation_kwargs == {"min_new_tokens": 256} and args.max_completion_length == 256
    assert args.mask_truncated_completions is False


def test_processes_are_labelled_by_their_part_of_the_job() -> None:
    python = "/work/.venv/bin/python"
    assert vs_trl.program([python, "-m", "inference_svc", "--port", "1"]) == "engines"
    assert vs_trl.program([python, "-m", "agents_adapter.proxy"]) == "proxy"
    assert vs_trl.program([python, "bench/vs_trl.py", "--trl-worker", "spec.json"]) == "TRL (trainer process)"
    assert vs_trl.program(["java", "kafka.Kafka", "server.properties"]) == "broker"
    cpu = vs_trl.ProcessCpu()
    import psutil

    assert vs_trl.program(psutil.Process().cmdline()) in cpu.totals()  # this process, always sampled
