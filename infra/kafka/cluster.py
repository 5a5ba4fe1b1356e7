"""A local Apache Kafka cluster in KRaft mode, run from the jars Maven resolved into `infra/kafka/lib`.

One node (`nodes=1`) is the default development and test broker; `nodes=3` runs three combined
broker+controller nodes with replication factor 3 and `min.insync.replicas=2` for fault tests.
Each node's config, log and data live under `data_root/node-N`, so a second `start()` reuses the
formatted storage and the jars; a node that is already up is left alone.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bus.errors import PortError
from bus.ports import free_port
from infra.errors import InfraError, KafkaStartError

log = logging.getLogger("sflow.kafka")

KAFKA_DIR: Final = Path(__file__).resolve().parent
LIB_DIR: Final = KAFKA_DIR / "lib"
REPO_ROOT: Final = KAFKA_DIR.parents[1]
# A 64K-token call is ~0.5 MB packed; leave room for trajectories of long agentic sessions.
MAX_MESSAGE_BYTES: Final = 32 * 1024 * 1024

_LOG4J: Final = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def ensure_jars() -> Path:
    """Resolves the broker jars through Maven (its ~/.m2 cache makes a repeat quick)."""
    if not any(LIB_DIR.glob("kafka_2.13-*.jar")):
        mvn = shutil.which("mvn")
        if mvn is None:
            raise InfraError("Maven (mvn) is needed to fetch the Kafka jars; install it (apt-get install maven)")
        log.info("resolving Kafka jars with Maven into %s", LIB_DIR)
        cmd = [mvn, "-q", "-B", "-f", str(KAFKA_DIR / "pom.xml"), "dependency:copy-dependencies"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise InfraError(f"mvn failed ({result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}")
    return LIB_DIR


def _kafka_uuid() -> str:
    """A cluster id as Kafka writes them; never starting with '-', which its command line reads as a flag."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_base_port(nodes: int = 1) -> int:
    """A base port whose broker ports (base..base+nodes-1) and controller ports (+100) are all free,
    so several test sessions on one machine each get their own cluster."""
    try:
        return free_port(offsets=[*range(nodes), *range(100, 100 + nodes)])
    except PortError as e:
        raise InfraError(str(e)) from e


@dataclass(frozen=True)
class KafkaNode:
    node_id: int
    host: str
    port: int
    controller_port: int
    directory: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.directory / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "server.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid


#: The brokers' JIT: the client compiler (C1) only. A broker here lives minutes (a test session, a demo, a
#: bench) on cores it shares with every service, and C2's compiler threads were then its largest CPU cost
#: (docs/architecture.md, "The hot path, as built"). `jvm_flags=()` gives a long-lived
#: broker the JVM's default tiers.
JIT_C1_ONLY = ("-XX:TieredStopAtLevel=1",)


class KafkaCluster:
    """Starts, stops and kills the nodes of one local KRaft cluster."""

    def __init__(
        self,
        data_root: Path,
        nodes: int = 1,
        host: str = "127.0.0.1",
        base_port: int = 9092,
        heap: str = "512m",
        jvm_flags: tuple[str, ...] = JIT_C1_ONLY,
    ) -> None:
        if nodes not in (1, 3):
            raise InfraError(f"nodes must be 1 or 3, got {nodes}")
        self.data_root = data_root
        self.heap = heap
        self.jvm_flags = jvm_flags
        self.nodes = [
            KafkaNode(i + 1, host, base_port + i, base_port + 100 + i, data_root / f"node-{i + 1}")
            for i in range(nodes)
        ]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.address for n in self.nodes)

    @property
    def replication_factor(self) -> int:
        return len(self.nodes)

    def _properties(self, node: KafkaNode) -> str:
        voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in self.nodes)
        rf = self.replication_factor
        min_isr = 2 if rf == 3 else 1
        return "\n".join(
            [
                "process.roles=broker,controller",
                f"node.id={node.node_id}",
                f"controller.quorum.voters={voters}",
                f"listeners=PLAINTEXT://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
                f"advertised.listeners=PLAINTEXT://{node.host}:{node.port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                f"log.dirs={node.directory / 'data'}",
                "num.partitions=4",
                f"default.replication.factor={rf}",
                f"min.insync.replicas={min_isr}",
                f"offsets.topic.replication.factor={rf}",
                f"transaction.state.log.replication.factor={rf}",
                f"transaction.state.log.min.isr={min_isr}",
                f"share.coordinator.state.topic.replication.factor={rf}",
                f"share.coordinator.state.topic.min.isr={min_isr}",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=false",
                f"message.max.bytes={MAX_MESSAGE_BYTES}",
                f"replica.fetch.max.bytes={MAX_MESSAGE_BYTES}",
                f"fetch.max.bytes={MAX_MESSAGE_BYTES * 2}",
                "socket.request.max.bytes=209715200",
                "log.retention.hours=-1",
                "log.segment.bytes=268435456",
                "unclean.leader.election.enable=false",
                "",
            ]
        )

    def _java(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise InfraError("a Java 17+ runtime is needed for Kafka (apt-get install openjdk-17-jre-headless)")
        return [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", *self.jvm_flags,
                "-cp", str(ensure_jars() / "*")]

    def _prepare(self, node: KafkaNode) -> Path:
        node.directory.mkdir(parents=True, exist_ok=True)
        props = node.directory / "server.properties"
        props.write_text(self._properties(node))
        (node.directory / "log4j2.properties").write_text(_LOG4J.format(log=node.log_file))
        if not (node.directory / "data" / "meta.properties").exists():
            cluster_id_file = self.data_root / "cluster.id"
            if not cluster_id_file.exists():
                self.data_root.mkdir(parents=True, exist_ok=True)
                cluster_id_file.write_text(_kafka_uuid())
            cluster_id = cluster_id_file.read_text().strip()
            cmd = [*self._java(), "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise KafkaStartError(f"formatting node {node.node_id} failed: {result.stdout}{result.stderr}")
        return props

    def start_node(self, node: KafkaNode) -> None:
        if node.pid() is not None:
            return
        props = self._prepare(node)
        cmd = [
            *self._java(),
            f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={node.directory}",
            "kafka.Kafka",
            str(props),
        ]
        with open(node.directory / "stdout.log", "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        node.pid_file.write_text(str(proc.pid))
        log.info("started Kafka node %d (pid %d) on %s", node.node_id, proc.pid, node.address)

    def start(self, timeout_s: float = 90.0) -> None:
        """Starts every node that is not running and waits until the cluster serves metadata."""
        for node in self.nodes:
            self.start_node(node)
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        last_error = "no answer"
        while time.monotonic() < deadline:
            dead = [n for n in self.nodes if n.pid() is None]
            if dead:
                raise KafkaStartError(f"Kafka node {dead[0].node_id} exited; see {dead[0].log_file}")
            if all(port_open(n.host, n.port) for n in self.nodes):
                try:
                    admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
                    md = admin.list_topics(timeout=3)
                    if len(md.brokers) == len(self.nodes):
                        return
                    last_error = f"{len(md.brokers)} of {len(self.nodes)} brokers registered"
                except Exception as e:  # the client raises KafkaException and friends while starting
                    last_error = str(e)
            time.sleep(0.5)
        raise KafkaStartError(f"Kafka not ready after {timeout_s}s ({last_error}); see {self.nodes[0].log_file}")

    def stop_node(self, node: KafkaNode, timeout_s: float = 30.0, kill: bool = False) -> None:
        """Stops a node by PID: SIGTERM (controlled shutdown), or SIGKILL for fault tests.

        A controlled shutdown needs an active controller: with no majority of the voters (every node is
        one) running, it waits for one in vain (the node left after a 3-node cluster lost one and stopped
        another sat out the whole `timeout_s`), so such a node is killed at once. Its log segments are on
        disk; the next start recovers them as after a crash."""
        pid = node.pid()
        if pid is None:
            node.pid_file.unlink(missing_ok=True)
            return
        if not kill and not self.has_quorum():
            log.info("Kafka node %d has no controller quorum to shut down with; killing it", node.node_id)
            kill = True
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            log.warning("Kafka node %d did not stop in %.0fs; killing it", node.node_id, timeout_s)
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)
        node.pid_file.unlink(missing_ok=True)

    def stop(self, kill: bool = False) -> None:
        for node in reversed(self.nodes):
            self.stop_node(node, kill=kill)

    def running(self) -> list[KafkaNode]:
        return [n for n in self.nodes if n.pid() is not None]

    def has_quorum(self) -> bool:
        """Whether a majority of the controller voters (all nodes) is running."""
        return 2 * len(self.running()) > len(self.nodes)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours still answers kill(0): reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return _proc_state(pid) not in ("Z", "X")


def _proc_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat.rsplit(")", 1)[1].split()[0]
