"""The example a run trains, as its config names it: each part a `package.module:attribute` reference,
imported and checked against the call the framework will make when the config is validated, so a bad
name or a wrong signature stops the run at start-up with the field and the value, not minutes later in
a worker's log.

The parts and the calls made (examples/calculator/README.md shows them written):

- `tasks(count, seed, **tasks_options)` -> the run's tasks (mappings, or dataclasses, each with a
  `task_id`): written one JSON object per line as the scheduler's dataset; or `tasks_file`, used as is.
- `task(row)` -> the agent's and the reward's task from a dispatched row (the row as written, its
  `task_id` the dispatched one); without it they get the row itself.
- `agent(model, max_turns=, max_tokens=, temperature=, ignore_eos=)` -> an object whose
  `async arun(client, task, session_id)` runs one episode with the `openai.AsyncOpenAI` client it is
  given (the capture proxy's) and returns what the reward reads.
- `reward(episode, task)` -> the session's reward (a float).
- `score(episode, task)` -> a held-out task's score in [0, 1], averaged into the evaluation's accuracy
  (infra/evaluation.py; the calculator: 1.0 when the final answer is right); without it, the reward.
- `warmup(count, seed, **warmup_options)` -> the supervised warm-up's demonstration records
  (`{"messages": [...], "tools": [...]}`); or `warmup_file`, the same records as JSON Lines.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, model_validator

from infra.errors import InfraError

_ANY = object()  # stands for any argument when a signature is checked


class Agent(Protocol):
    def arun(self, client: Any, task: Any, session_id: str) -> Awaitable[Any]: ...


def load_reference(reference: str) -> Callable[..., Any]:
    """The callable a `package.module:attribute` reference names (InfraError names what is wrong)."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise InfraError(f"{reference!r} is not of the form package.module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise InfraError(f"{reference!r}: cannot import {module_name!r}: {e}") from e
    for name in attribute.split("."):
        if not hasattr(target, name):
            raise InfraError(f"{reference!r}: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, name)
    if not callable(target):
        raise InfraError(f"{reference!r} is a {type(target).__name__}, not a callable")
    return target


def check_call(field: str, reference: str, target: Callable[..., Any], n_args: int, kwargs: Mapping[str, Any]) -> None:
    """Refuses a callable that cannot take the call the framework makes (a missing argument, an option it
    does not accept); the error names the field that named it."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # a builtin without a signature: checked when it is called
    try:
        signature.bind(*([_ANY] * n_args), **kwargs)
    except TypeError as e:
        names = ", ".join(["_"] * n_args + [f"{k}=" for k in kwargs])
        raise InfraError(f"{field}={reference!r} cannot be called as ({names}): {e}") from e


def _loadable(reference: str) -> str:
    try:
        load_reference(reference)
    except InfraError as e:
        raise ValueError(str(e)) from e
    return reference


Reference = Annotated[str, AfterValidator(_loadable)]
AGENT_SETTINGS = ("max_turns", "max_tokens", "temperature", "ignore_eos")


class ExampleSection(BaseModel):
    """What a run trains: its tasks, agent, reward and warm-up data (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: Reference | None = Field(default=None, description="Task generator: tasks(count, seed, **tasks_options).")
    tasks_file: Path | None = Field(default=None, description="A JSON Lines tasks file, instead of `tasks`.")
    tasks_options: dict[str, JsonValue] = Field(default={}, description="Keyword arguments of `tasks`.")
    task: Reference | None = Field(default=None, description="task(row): a dispatched row to the agent's task.")
    agent: Reference = Field(description="agent(model, max_turns=, max_tokens=, temperature=, ignore_eos=).")
    reward: Reference = Field(description="reward(episode, task) -> float, reported when the session ends.")
    score: Reference | None = Field(default=None, description=(
        "score(episode, task) -> float in [0, 1]: a held-out task's accuracy (None: the reward)."))
    warmup: Reference | None = Field(default=None, description="warmup(count, seed, **warmup_options) -> records.")
    warmup_file: Path | None = Field(default=None, description="Demonstration records (JSON Lines), instead.")
    warmup_options: dict[str, JsonValue] = Field(default={}, description="Keyword arguments of `warmup`.")

    @model_validator(mode="after")
    def _calls_fit(self) -> ExampleSection:
        if (self.tasks is None) == (self.tasks_file is None):
            raise ValueError(f"give one of tasks={self.tasks!r} and tasks_file={self.tasks_file!r}")
        if self.warmup is not None and self.warmup_file is not None:
            raise ValueError(f"give at most one of warmup={self.warmup!r} and warmup_file={self.warmup_file!r}")
        for options, generator in (("tasks_options", self.tasks), ("warmup_options", self.warmup)):
            if getattr(self, options) and generator is None:
                raise ValueError(f"{options}={getattr(self, options)!r} is given without a generator to take it")
        for field, path in (("tasks_file", self.tasks_file), ("warmup_file", self.warmup_file)):
            if path is not None and not path.is_file():
                raise ValueError(f"{field}={str(path)!r} is not a file")
        calls: list[tuple[str, str | None, int, Mapping[str, Any]]] = [
            ("tasks", self.tasks, 2, self.tasks_options), ("task", self.task, 1, {}),
            ("agent", self.agent, 1, dict.fromkeys(AGENT_SETTINGS, _ANY)), ("reward", self.reward, 2, {}),
            ("score", self.score, 2, {}), ("warmup", self.warmup, 2, self.warmup_options)]
        for field, reference, n_args, kwargs in calls:
            if reference is not None:
                try:
                    check_call(field, reference, load_reference(reference), n_args, kwargs)
                except InfraError as e:
                    options = f" (its {field}_options={dict(kwargs)!r})" if field in ("tasks", "warmup") else ""
                    raise ValueError(f"{e}{options}") from e
        return self


CALCULATOR = ExampleSection(
    tasks="examples.calculator.tasks:make_arithmetic_tasks", tasks_options={"max_operand": 9},
    task="examples.calculator.tasks:task_from_row",
    agent="examples.calculator.agent:CalculatorAgent",
    reward="examples.calculator.reward:shaped_reward", score="examples.calculator.reward:correct",
    warmup="examples.calculator.warmup:demonstrations", warmup_options={"max_operand": 9, "direct_fraction": 0.5},
)
