"""A Faust worker run as a subprocess by test_bus_kafka: records the typed events it receives.

Usage: python faust_typed_worker.py BOOTSTRAP PREFIX DATA_DIR OUT_FILE EXPECTED
It appends one JSON line per event (type, session id) to OUT_FILE and exits after EXPECTED events.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bus.config import BusConfig
from bus.faust_app import CODEC, create_faust_app, typed_events
from bus.producer import EventProducer


def main() -> None:
    bootstrap, prefix, data_dir, out_file, expected = sys.argv[1:6]
    config = BusConfig(bootstrap_servers=bootstrap, topic_prefix=prefix)
    dlq = EventProducer(config)
    app = create_faust_app("typed-test", config, Path(data_dir))
    topic = app.topic(config.topic("sessions"), value_serializer=CODEC)
    seen: list[str] = []

    @app.agent(topic)
    async def record(stream):  # type: ignore[no-untyped-def]
        async for _, event in typed_events(stream.events(), dlq, config, "typed-test"):
            seen.append(event.event_type)
            with open(out_file, "a") as out:
                out.write(json.dumps({"type": event.event_type, "session": event.session_id}) + "\n")
            if len(seen) >= int(expected):
                dlq.flush()
                os._exit(0)

    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    app.main()


if __name__ == "__main__":
    main()
