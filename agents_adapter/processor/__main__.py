"""`python -m agents_adapter.processor [options]`: the trajectory processor's Faust worker (`faust_shell`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from agents_adapter.processor.config import ProcessorConfig
from agents_adapter.processor.faust_shell import worker


def main(argv: Sequence[str] | None = None) -> None:
    config = ProcessorConfig.from_args(argv)
    os.makedirs(config.data_dir, exist_ok=True)
    worker(config)


if __name__ == "__main__":
    main()
