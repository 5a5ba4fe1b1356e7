"""Creates the catalog topics idempotently."""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from bus.config import BusConfig
from bus.errors import TopicError
from bus.topics import CATALOG, TopicSpec


def admin_client(config: BusConfig) -> AdminClient:
    return AdminClient({"bootstrap.servers": config.bootstrap_servers, "client.id": config.client_id})


def ensure_topics(config: BusConfig, specs: Iterable[TopicSpec] = CATALOG, timeout_s: float = 30.0) -> list[str]:
    """Creates missing topics and waits until each has a leader; returns the names it created."""
    admin = admin_client(config)
    specs = list(specs)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    new = [
        NewTopic(
            config.topic(s.name),
            num_partitions=s.partitions,
            replication_factor=config.replication_factor,
            config=s.configs(),
        )
        for s in specs
        if config.topic(s.name) not in existing
    ]
    created: list[str] = []
    if new:
        for name, future in admin.create_topics(new, request_timeout=timeout_s).items():
            try:
                future.result()
                created.append(name)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise TopicError(f"creating {name}: {e.args[0].str()}") from e
    _wait_for_leaders(admin, [config.topic(s.name) for s in specs], timeout_s)
    return created


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = names
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=timeout_s)
        pending = [
            n
            for n in names
            if n not in md.topics
            or md.topics[n].error is not None
            or any(p.leader < 0 for p in md.topics[n].partitions.values())
        ]
        if not pending:
            return
        time.sleep(0.2)
    raise TopicError(f"topics without a leader after {timeout_s}s: {pending}")


def delete_topics(config: BusConfig, names: Iterable[str], timeout_s: float = 30.0) -> None:
    admin = admin_client(config)
    for name, future in admin.delete_topics(list(names), request_timeout=timeout_s).items():
        try:
            future.result()
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise TopicError(f"deleting {name}: {e.args[0].str()}") from e
