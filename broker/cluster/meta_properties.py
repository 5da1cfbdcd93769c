"""meta.properties: what a log dir remembers of the cluster it belongs to.

Kafka writes ``meta.properties`` into every log dir (``version``, ``cluster.id``, ``node.id``;
version 0, the ZooKeeper era's, names the node ``broker.id``) and refuses to start when a dir
says another cluster or another node: serving a dir's partitions under the wrong id, or in the
wrong cluster, would mix two brokers' data. mini-broker writes version 1 and reads both.

``check_meta_properties`` is the start-up check: every dir that has the file must agree with
the others, with the cluster id found in etcd and with ``node.id``; then the dirs without one
get it. Failures are one-line ``StartupError``s naming the dir and what to do.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.log.disk import atomic_write
from broker.startup_error import StartupError

FILE_NAME = "meta.properties"


def new_cluster_id() -> str:
    """A random id in Kafka's form: a UUID's 16 bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class MetaProperties:
    cluster_id: str
    node_id: int
    version: int = 1

    def to_text(self) -> str:
        """Java properties as Kafka writes them: a comment with the date, then the keys."""
        node_key = "broker.id" if self.version == 0 else "node.id"
        stamp = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
        return (f"#\n#{stamp}\n{node_key}={self.node_id}\nversion={self.version}\n"
                f"cluster.id={self.cluster_id}\n")

    @classmethod
    def parse(cls, text: str, where: Path) -> MetaProperties:
        props = _properties(text)
        try:
            version = int(props.get("version", "0"))
            if version not in (0, 1):
                raise ValueError(f"version {version} is not known")
            node = props["broker.id" if version == 0 else "node.id"]
            cluster_id = props["cluster.id"]
            return cls(cluster_id, int(node), version)
        except (KeyError, ValueError) as e:
            raise StartupError(
                f"{where} cannot be read ({_why(e)}): restore it, or delete the log dir's "
                f"contents to start it over as a new broker") from None


def _why(e: Exception) -> str:
    return f"no {e.args[0]}" if isinstance(e, KeyError) else str(e)


def _properties(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        for i, ch in enumerate(line):
            if ch in "=:":
                out[line[:i].strip()] = line[i + 1 :].strip()
                break
    return out


def read_meta_properties(log_dirs: Sequence[Path]) -> dict[Path, MetaProperties | None]:
    """Each dir's meta.properties (None where a dir has none yet)."""
    out: dict[Path, MetaProperties | None] = {}
    for log_dir in log_dirs:
        path = Path(log_dir) / FILE_NAME
        try:
            text = path.read_text()
        except FileNotFoundError:
            out[Path(log_dir)] = None
            continue
        except OSError as e:
            raise StartupError(f"{path} cannot be read: {e.strerror}") from None
        out[Path(log_dir)] = MetaProperties.parse(text, path)
    return out


def check_meta_properties(
    log_dirs: Sequence[Path], cluster_id: str, node_id: int, *, where: str = "etcd"
) -> None:
    """Refuse dirs of another cluster or node, then give every dir its meta.properties.

    Call it before the log dirs are loaded (a wrong dir must not be recovered or served);
    a dir that does not exist yet is created. ``where`` names the source of ``cluster_id``
    for the error message (the etcd endpoint and prefix)."""
    found = read_meta_properties(log_dirs)
    known = {d: m for d, m in found.items() if m is not None}
    pairs = {(m.cluster_id, m.node_id) for m in known.values()}
    if len(pairs) > 1:
        listed = "; ".join(f"{d}: cluster {m.cluster_id}, node {m.node_id}"
                           for d, m in known.items())
        raise StartupError(
            f"log.dirs disagree on their cluster and node ({listed}): two brokers' dirs were "
            f"mixed; give this broker only its own dirs")
    for log_dir, meta in known.items():
        if meta.cluster_id != cluster_id:
            raise StartupError(
                f"{log_dir} belongs to cluster {meta.cluster_id}, but the cluster in {where} is "
                f"{cluster_id}: this broker is joining another cluster (check "
                f"minibroker.etcd.endpoints and minibroker.etcd.prefix, or empty the dir to "
                f"join as a new broker)")
        if meta.node_id != node_id:
            raise StartupError(
                f"{log_dir} belongs to node {meta.node_id}, but node.id is {node_id}: set "
                f"node.id={meta.node_id} to serve this dir (or empty it to start a new broker)")
    text = MetaProperties(cluster_id, node_id).to_text().encode()
    for log_dir, stored in found.items():
        if stored is None:
            try:
                log_dir.mkdir(parents=True, exist_ok=True)  # as the log manager would
                atomic_write(log_dir / FILE_NAME, text)
            except OSError as e:
                raise StartupError(f"{log_dir / FILE_NAME} cannot be written: {e.strerror or e}"
                                   f" (log.dirs must be writable directories)") from None
