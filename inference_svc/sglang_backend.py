"""SGLang as the engine on a GPU: launch `python -m sglang.launch_server`, wait until it answers, stop it.

SGLang serves the same native API as our app, so the adapter talks to it with `InferenceClient` and the
controller drives it through `RemoteEngineControl`. sglang is optional and heavy: it is imported only
inside the functions that need it, and `sglang_unavailable_reason()` says why it cannot be used here.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from inference_svc.config import InferenceConfig
from schemas.inference.client import InferenceClient, RemoteEngineControl
from schemas.inference.errors import BackendUnavailableError, InvalidRequestError

logger = logging.getLogger(__name__)


def sglang_unavailable_reason() -> str | None:
    """None when sglang is importable and a CUDA GPU is visible; otherwise the reason, in words."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed (pip install 'sglang[all]' on a GPU machine)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (SGLang needs one)"
    return None


def launch_command(config: InferenceConfig) -> list[str]:
    """The `sglang.launch_server` command line for this config (extra flags from config.sglang_args)."""
    context = config.max_context
    model_config = config.model_path / "config.json"
    if model_config.is_file():
        max_positions = json.loads(model_config.read_text()).get("max_position_embeddings")
        if isinstance(max_positions, int):
            context = min(context, max_positions)
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(config.model_path),
        "--host", config.host,
        "--port", str(config.port),
        "--max-running-requests", str(config.max_running_requests),
        "--context-length", str(context),
        "--dtype", config.dtype,
        "--random-seed", str(config.seed),
        "--weight-version", str(config.weight_version),
        *(["--api-key", config.control_key.get_secret_value()] if config.control_key is not None else []),
        *config.sglang_args,
    ]


class SGLangServer:
    """One SGLang server process for one rollout resource."""

    def __init__(self, config: InferenceConfig, log_path: Path | None = None) -> None:
        self.config = config
        self.log_path = log_path or Path(f"sglang-{config.resource_id}.log")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def _auth(self) -> dict[str, str]:
        key = self.config.control_key
        return {} if key is None else {"Authorization": f"Bearer {key.get_secret_value()}"}

    @property
    def base_url(self) -> str:
        return self.config.base_url

    def start(self) -> SGLangServer:
        reason = sglang_unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(reason)
        command = launch_command(self.config)
        logger.info("launching sglang: %s", " ".join(command), extra={"resource": self.config.resource_id})
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.wait_healthy(self.config.sglang_startup_timeout_s)
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        """Polls /health_generate until it answers 200; fails early if the process exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise BackendUnavailableError(
                    f"sglang exited with code {self._process.returncode}; log tail:\n{self._log_tail()}"
                )
            try:
                if httpx.get(f"{self.base_url}/health_generate", timeout=10, headers=self._auth).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise BackendUnavailableError(f"sglang did not become healthy within {timeout_s:.0f}s")

    def wait(self) -> int:
        """Blocks until the server exits; returns its exit code."""
        if self._process is None:
            return 0
        return self._process.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout_s)

    def client(self) -> InferenceClient:
        key = self.config.control_key
        return InferenceClient(self.base_url, control_key=None if key is None else key.get_secret_value())

    def control(self) -> RemoteEngineControl:
        return RemoteEngineControl(self.base_url)

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def validate_with_sglang(payload: dict[str, Any], vocab_size: int | None = None) -> None:
    """Checks a /generate body with sglang's own request and sampling classes (raises InvalidRequestError).

    Proves that what our client sends is what SGLang accepts, field names included.
    """
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    try:
        request = GenerateReqInput(**payload)
        params = SamplingParams(**(request.sampling_params or {}))
        if vocab_size is not None:
            params.verify(vocab_size)
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(f"sglang refuses the payload {payload}: {e}") from e
