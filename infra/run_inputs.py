"""What a run prepares before its services start, from its config's example: the warmed-up model and
the tasks file the scheduler dispatches.

The warm-up is cached under var/cache by everything that determines it (model settings, the
demonstrations' source and options, the seed), so a second run with the same settings starts at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from infra import stack
from infra.errors import InfraError
from infra.example import ExampleSection, load_reference
from infra.run_config import RunConfig

if TYPE_CHECKING:
    from trainer_svc.warmup import Demonstrations

console = Console()
_CACHE_FORMAT = 5  # bumped when what the cached warm-up depends on changes (5: 32K-token context)


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def tasks(self) -> Path:
        return self.root / "tasks.jsonl"

    @property
    def weights(self) -> Path:
        return self.root / "weights"

    @property
    def analytics(self) -> Path:
        return self.root / "analytics"

    @property
    def eval_tasks(self) -> Path:
        return self.root / "eval_tasks.jsonl"


def _warmup_source(example: ExampleSection) -> object:
    """What the demonstrations are made from, for the cache key (a file by its content)."""
    if example.warmup_file is not None:
        return hashlib.sha256(example.warmup_file.read_bytes()).hexdigest()
    return [example.warmup, example.warmup_options]


def _demonstrations(config: RunConfig) -> Demonstrations:
    from trainer_svc.warmup import demonstrations_from_records, read_demonstrations

    example = config.example
    if example.warmup_file is not None:
        return read_demonstrations(example.warmup_file)
    assert example.warmup is not None  # RunConfig refuses warm-up steps without demonstrations
    records = load_reference(example.warmup)(config.model.warmup_tasks, config.warmup_seed, **example.warmup_options)
    return demonstrations_from_records(records, f"example.warmup={example.warmup!r}")


def warmup_cache_key(config: RunConfig) -> str:
    """Everything the warm-up's result depends on, hashed: runs that differ only elsewhere share it."""
    from infra.hf_model import directory_digest

    # a base model directory by its content, not where it lies
    base = [directory_digest(config.model.path)] if config.model.path is not None else []
    return hashlib.sha256(json.dumps(
        # exclude_none: an unset `shape` or `path` leaves the key of every earlier config as it was (their caches
        # stay valid)
        [config.model.model_dump(exclude={"warmup_seed", "warmup_workers", "path"}, exclude_none=True),
         _warmup_source(config.example),
         config.warmup_seed, _CACHE_FORMAT, *base]).encode()
    ).hexdigest()[:12]


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """The warm-up's model is tiny and the machine's cores are shared with the broker and other jobs: with
    torch's default of one thread per core its OpenMP workers spin-wait for each other whenever a core is
    taken (measured on 2 cores at load 6.6: over 10 s a step with 2 threads, 2.2 s with 1). The services run
    with one thread too (infra/launcher.py)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _base_model(config: RunConfig, key: str) -> Path:
    """`model.path`, else the default model of the config's settings, written under var/cache."""
    from inference_svc.default_model import DefaultModelSpec, create_default_model

    if config.model.path is not None:
        return config.model.path
    shape = config.model.shape.model_dump() if config.model.shape is not None else {}
    spec = DefaultModelSpec(tokenizer=config.model.tokenizer, chat_template=config.model.chat_template,
                            bpe_vocab_size=config.model.bpe_vocab_size, **shape)
    return create_default_model(stack.VAR_DIR / "cache" / f"base-{key}", spec)


def prepare_model(config: RunConfig, paths: RunPaths) -> Path:
    """Base model (`model.path`, else the default model) + supervised warm-up, cached by its settings under
    var/cache (a re-run is instant); `model.path` without warm-up is copied as it is."""
    from trainer_svc.warmup import supervised_warmup

    if config.model.path is not None and not config.model.warmup_steps:
        shutil.copytree(config.model.path, paths.model, dirs_exist_ok=True)
        return paths.model
    key = warmup_cache_key(config)
    cached = stack.VAR_DIR / "cache" / f"warm-{key}"
    if not any(cached.glob("*.safetensors")):
        base = _base_model(config, key)
        if config.model.warmup_steps:
            data = _demonstrations(config)
            columns = (TextColumn("warm-up (supervised, cached after the first run)"), BarColumn(),
                       MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn())
            with _one_torch_thread(), Progress(*columns, console=console) as progress:
                bar = progress.add_task("warm-up", total=config.model.warmup_steps, loss="-")
                supervised_warmup(base, cached.with_suffix(".tmp"), data.conversations, data.tools,
                                  steps=config.model.warmup_steps, seed=config.warmup_seed,
                                  workers=config.model.warmup_workers or len(os.sched_getaffinity(0)),
                                  on_step=lambda step, loss: progress.update(bar, completed=step + 1,
                                                                             loss=f"{loss:.3f}"))
            cached.with_suffix(".tmp").rename(cached)
        else:
            shutil.copytree(base, cached)
    shutil.copytree(cached, paths.model, dirs_exist_ok=True)
    return paths.model


def task_rows(tasks: Iterable[object], source: str) -> list[dict[str, Any]]:
    """The generator's tasks as JSON objects (a dataclass by its fields)."""
    rows = []
    for i, task in enumerate(tasks):
        if dataclasses.is_dataclass(task) and not isinstance(task, type):
            rows.append(dataclasses.asdict(task))
        elif isinstance(task, dict):
            rows.append(dict(task))
        else:
            raise InfraError(f"{source}: task {i} is a {type(task).__name__}, expected a mapping or a dataclass")
    return rows


def _write_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)


def write_eval_tasks(config: RunConfig, paths: RunPaths) -> list[dict[str, Any]]:
    """The held-out tasks (infra/evaluation.py): the example's generator with `eval.seed`, none of them a
    training task of the written tasks file (by content or id), checked again; none without `eval.enabled`."""
    from infra.evaluation import disjoint, held_out_rows

    if not config.eval.enabled:
        return []
    example = config.example
    assert example.tasks is not None  # RunConfig refuses eval without a task generator
    generator = load_reference(example.tasks)
    source = f"example.tasks={example.tasks!r} (eval.seed={config.eval.seed})"
    train = [json.loads(line) for line in paths.tasks.read_text().splitlines() if line.strip()]
    rows = held_out_rows(lambda n, seed: task_rows(generator(n, seed, **example.tasks_options), source),
                         config.eval.tasks, config.eval.seed, train)
    if not disjoint(rows, train):
        raise InfraError(f"{source}: held-out tasks overlap the training tasks")
    _write_rows(paths.eval_tasks, rows)
    return rows


def write_tasks(config: RunConfig, paths: RunPaths) -> None:
    """The scheduler's dataset: the example's tasks file as is, or its generator's tasks, one per line."""
    example = config.example
    if example.tasks_file is not None:
        shutil.copyfile(example.tasks_file, paths.tasks)
        return
    assert example.tasks is not None  # ExampleSection takes exactly one of tasks and tasks_file
    generated = load_reference(example.tasks)(config.tasks.count, config.tasks.seed, **example.tasks_options)
    _write_rows(paths.tasks, task_rows(generated, f"example.tasks={example.tasks!r}"))
