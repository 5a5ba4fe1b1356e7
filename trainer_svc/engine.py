"""A model under DeepSpeed, with the accumulation boundary owned by the trainer.

Why "unmanaged" accumulation: a train step's trees are packed into micro-batches by tokens, so the
number of micro-batches per optimizer update changes from step to step. DeepSpeed's usual counter
(`gradient_accumulation_steps` micro-steps per update) cannot follow that; with
`managed_gradient_accumulation: false` every `backward` only accumulates and every `step` is an update
(DeepSpeed >= 0.18). Losses arrive already normalised over the whole update (see `losses`), so
`backward` does not rescale them by a gradient-accumulation count either.

On a machine without a GPU the engine runs on DeepSpeed's CPU accelerator with a gloo process group of
one rank; the launcher variables (MASTER_ADDR, a free MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) are set
when missing so a plain `python` process can start it. DeepSpeed is imported inside functions only.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bus.ports import free_port
from trainer_svc.config import EngineConfig
from trainer_svc.errors import EngineError

log = logging.getLogger(__name__)

_DEFAULT_EXTENSIONS_DIR = Path(__file__).resolve().parents[1] / ".cache" / "torch_extensions"
_STATE_TAG = "engine"


def resolve_device(device: str) -> str:
    """`auto` means cuda when torch sees a GPU, else cpu."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def prepare_environment(device: str) -> None:
    """Sets what DeepSpeed reads at import and at process-group start, keeping anything already set."""
    accelerator = "cuda" if device == "cuda" else "cpu"
    chosen = os.environ.setdefault("DS_ACCELERATOR", accelerator)
    if chosen != accelerator:
        raise EngineError(f"engine.device={device!r} but DS_ACCELERATOR={chosen!r} is set in the environment")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(_DEFAULT_EXTENSIONS_DIR))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(name, value)


def build_cpu_ops() -> None:
    """Compiles the C++ ops DeepSpeed's CPU accelerator JIT-builds on first use, into TORCH_EXTENSIONS_DIR.

    Why ahead of time: the gloo process group loads the shared-memory collective op
    (`deepspeed_shm_comm`) when a trainer starts, and its first build took 59 s on two cores: a fresh
    clone's trainer would join its first step a minute late (`make install` runs this). The same holds
    for `engine.optimizer: cpu_adam` (`cpu_adam`, 69 s on two cores, the slowest test of a fresh
    clone's suite before it was built here). Later loads find the built libraries.
    """
    prepare_environment("cpu")
    try:
        from deepspeed.accelerator import get_accelerator

        for builder in ("ShareMemCommBuilder", "CPUAdamBuilder"):
            get_accelerator().create_op_builder(builder).load()
    except Exception as e:  # a compiler error surfaces as anything from RuntimeError to CalledProcessError
        raise EngineError(f"building DeepSpeed's CPU ops into {os.environ['TORCH_EXTENSIONS_DIR']} failed: {e}") from e


def _init_process_group(device: str) -> None:
    import deepspeed

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo", verbose=False)


def deepspeed_config(config: EngineConfig) -> dict[str, Any]:
    """The DeepSpeed JSON config for one rank with caller-owned accumulation."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": config.precision == "bf16"},
        "gradient_clipping": config.grad_clip,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def build_optimizer(params: list[nn.Parameter], config: EngineConfig, learning_rate: float) -> torch.optim.Optimizer:
    """Plain torch AdamW, or DeepSpeed's vectorised CPU Adam (a JIT-built C++ op; first build ~1 min)."""
    betas = (config.adam_beta1, config.adam_beta2)
    if config.optimizer == "cpu_adam":
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(
                params, lr=learning_rate, betas=betas, eps=config.adam_eps, weight_decay=config.weight_decay,
                adamw_mode=True,
            )
        except Exception as e:  # the op build raises anything from RuntimeError to CalledProcessError
            raise EngineError(f"engine.optimizer='cpu_adam': DeepSpeed CPU Adam is unavailable: {e}") from e
    return torch.optim.AdamW(
        params, lr=learning_rate, betas=betas, eps=config.adam_eps, weight_decay=config.weight_decay
    )


class TrainEngine:
    """One model (policy or critic) wrapped by `deepspeed.initialize`.

    `engine(**inputs)` is the forward to use while training (DeepSpeed's hooks and casts run);
    `module` is the plain model underneath (what gets saved as a Hugging Face directory).
    """

    def __init__(self, model: nn.Module, config: EngineConfig, *, learning_rate: float | None = None) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        prepare_environment(self.device)
        try:
            import deepspeed

            logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
            _init_process_group(self.device)
            torch.manual_seed(config.seed)
            if self.device == "cuda":
                model = model.to(f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = build_optimizer(params, config, learning_rate or config.learning_rate)
            engine, _, _, _ = deepspeed.initialize(
                model=model, optimizer=optimizer, config=deepspeed_config(config), dist_init_required=False
            )
        except EngineError:
            raise
        except Exception as e:
            raise EngineError(f"deepspeed.initialize failed (zero_stage={config.zero_stage}, "
                              f"precision={config.precision!r}, device={self.device!r}): {e}") from e
        self.engine = engine
        self.updates = 0

    @property
    def module(self) -> nn.Module:
        return self.engine.module

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulates the gradient of an already normalised micro-batch loss."""
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        """Applies one optimizer update from the accumulated gradients; returns the global grad norm
        (before clipping). DeepSpeed reports it for ZeRO and mixed precision; for plain fp32 stage 0
        the gradients are still on the parameters and it is measured here."""
        local_norm = self._local_grad_norm() if self.config.zero_stage == 0 else None
        self.engine.step()
        self.updates += 1
        norm = self.engine.get_global_grad_norm()
        if norm is None:
            return float("nan") if local_norm is None else local_norm
        return float(norm.item() if isinstance(norm, torch.Tensor) else norm)

    def gradients_finite(self) -> bool:
        """Whether the accumulated gradients are all finite, checked before `step` applies them. The
        gradients on the parameters are what ZeRO stage 0 in fp32 steps from; ZeRO 1/2 and bf16 move them
        into their own buffers as they reduce, so for those this sees only what is left on the parameters
        and the trainer's checks of the loss and of the updated weights are what guard them."""
        return all(bool(torch.isfinite(p.grad).all()) for p in self.module.parameters() if p.grad is not None)

    def discard_gradients(self) -> None:
        """Drops what was accumulated for an update that is refused, so the next update starts clean."""
        self.engine.zero_grad()
        zero_grad = getattr(self.engine.optimizer, "zero_grad", None)
        if zero_grad is not None:
            zero_grad(set_to_none=True)

    def parameters_finite(self) -> bool:
        return all(bool(torch.isfinite(p.detach()).all()) for p in self.module.parameters())

    def _local_grad_norm(self) -> float | None:
        grads = [p.grad.detach().float() for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return None
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))

    def save_state(self, directory: Path) -> None:
        """Module, optimizer (and ZeRO partitions, fp32 master weights) in DeepSpeed's own format."""
        try:
            self.engine.save_checkpoint(str(directory), tag=_STATE_TAG, client_state={"updates": self.updates},
                                        save_latest=False)
        except Exception as e:
            raise EngineError(f"DeepSpeed could not save its state to {directory}: {e}") from e

    def load_state(self, directory: Path) -> None:
        """Restores what `save_state` wrote; the module weights are replaced as well."""
        if not (directory / _STATE_TAG).is_dir():
            raise EngineError(f"{directory} holds no DeepSpeed state (missing {_STATE_TAG}/)")
        try:
            path, client_state = self.engine.load_checkpoint(
                str(directory), tag=_STATE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
            )
        except Exception as e:
            raise EngineError(f"DeepSpeed could not load its state from {directory}: {e}") from e
        if path is None:
            raise EngineError(f"DeepSpeed found no checkpoint under {directory}")
        self.updates = int((client_state or {}).get("updates", 0))
