"""`python -m agents_adapter.proxy --model-path DIR [--endpoint rollout-0=http://127.0.0.1:30000 ...]`: parse config
-> build -> run.

Every scalar `AdapterConfig` field is a flag (`--session-cache-size 1000`); `--endpoint` repeats
(`RESOURCE_ID=URL` or a bare URL); Kafka comes from `--bootstrap-servers` / `--topic-prefix` or the
environment (SFLOW_BOOTSTRAP, SFLOW_TOPIC_PREFIX). Keys: `--api-keys-file` and/or $SFLOW_ADAPTER_API_KEYS;
the admin key from $SFLOW_ADAPTER_ADMIN_KEY(_SHA256). `--hash-key KEY` prints the sha256 entry to put
in a keys file and exits. `--session-store-path FILE` keeps sessions (owners, call counts, ends, retried
requests' answers) in SQLite so that they survive a restart of the proxy (`agents_adapter.proxy.session_store`).
"""

from __future__ import annotations

import argparse
import gc
from typing import Any

from agents_adapter.errors import ConfigError
from agents_adapter.proxy.config import HASH_PREFIX, AdapterConfig, hash_api_key
from bus.errors import BusError
from bus.kit import add_bus_flags, add_config_flags, build_or_exit, config_values, pop_bus_settings
from bus.log import configure_logging

_SPECIAL = {"agent_keys", "inference_endpoints", "bus"}


def parse_config(argv: list[str] | None = None) -> AdapterConfig | None:
    """The validated config, or None when the command only printed something (--hash-key)."""
    parser = argparse.ArgumentParser(prog="python -m agents_adapter.proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--hash-key", default=None, help="print the keys-file entry of a key and exit")
    add_config_flags(parser, AdapterConfig, skip=_SPECIAL)
    parser.add_argument("--endpoint", dest="inference_endpoints", action="append", default=argparse.SUPPRESS,
                        help="static inference endpoint, RESOURCE_ID=URL or URL (repeat for several)")
    add_bus_flags(parser)
    values: dict[str, Any] = vars(parser.parse_args(argv))
    key = values.pop("hash_key")
    if key is not None:
        print(f"{HASH_PREFIX}{hash_api_key(key)}")
        return None

    def build() -> AdapterConfig:
        bus = pop_bus_settings(values, client_id="agents-adapter")
        return AdapterConfig.build(bus=bus, **config_values(AdapterConfig, values, raw={"inference_endpoints"}))

    return build_or_exit(parser, build, (ConfigError, ValueError, BusError))


def main(argv: list[str] | None = None) -> None:
    config = parse_config(argv)
    if config is None:
        return
    configure_logging("agents-adapter", config.log_level)
    import uvicorn

    from agents_adapter.proxy.app import create_app

    app = create_app(config)
    quiet_collector()
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, timeout_keep_alive=30)


def quiet_collector() -> None:
    """Moves what start-up built (modules, the tokenizer, the template, the validators: most of the process's
    objects) out of the cyclic garbage collector's reach: its passes over them were ~13% of the proxy's CPU
    per call (perf, bench/adapter_bench.py), for objects that live as long as the process. A call's own
    garbage is collected as before."""
    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    main()
