"""The ACLs, SCRAM credentials, topic configs and dynamic broker configs of a cluster, in etcd
where Kafka kept them in ZooKeeper.

Keys (Kafka's ZooKeeper paths, ``ZkData``):

- ``/kafka-acl/<ResourceType>/<name>`` (LITERAL) and
  ``/kafka-acl-extended/prefixed/<ResourceType>/<name>`` (PREFIXED): one resource's ACLs,
  ``{"version":1,"acls":[{"principal","permissionType","operations","host"}]}`` with Kafka's
  names (``Topic``, ``Allow``, ``DescribeConfigs``). Changed by compare-and-swap on the key's
  version, re-read and retried when another broker's change won (Kafka's
  ``updateResourceAcls``), so concurrent creations on different brokers all land.
- ``/config/users/<user>``: ``{"version":1,"config":{"SCRAM-SHA-256":"salt=...,stored_key=...,
  server_key=...,iterations=N"}}`` (Kafka's ScramCredentialUtils form; other keys of the
  user's config are kept), changed by compare-and-swap as well.
- ``/config/topics/<topic>``: ``{"version":1,"config":{...}}``, written with the topic by the
  controller (topic_controller.py) and removed with it; AlterConfigs on any broker replaces the
  overrides by compare-and-swap (never re-creating a topic deleted meanwhile), as Kafka's
  ``AdminZkClient.changeTopicConfig`` did from any broker. Every broker applies a change to
  the logs of the topic's partitions it holds (the watch replacing Kafka's
  ``/config/changes`` notifications).
- ``/config/brokers/<default>`` (the cluster default, BROKER resource "") and
  ``/config/brokers/<id>``: ``{"version":1,"config":{...}}``, replaced whole by AlterConfigs
  (Kafka's ``changeBrokerConfig``); every broker applies the default and its own.

Invariant: this broker's view is the keys at the follower's revision, plus its own changes not
yet acknowledged by etcd (applied at once so the broker's next decision already sees them);
writes go to etcd one at a time, in the order they were made, and ``flushed()`` is done when
the last of them is. A write that cannot be made fails its ``flushed()`` and the view is
listed again from etcd, so it never keeps a change etcd does not have.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from broker.cluster.prefix_follower import PrefixFollower
from broker.cluster.store import (
    Compare,
    Delete,
    EventType,
    Listing,
    MetadataStore,
    Put,
    StoreError,
    WatchEvent,
    cancel_and_wait,
)
from broker.cluster.topic_state import TOPIC_CONFIGS, MalformedMetadata, decode_topic_config
from broker.metadata.shared_state import AclDoc, ScramCredentials, SharedState
from broker.replica.delayed_result import Completion

logger = structlog.get_logger("broker.cluster")

ACL_ROOT = "/kafka-acl"  # both stores below, and nothing else, start so
LITERAL_ACLS = "/kafka-acl/"
PREFIXED_ACLS = "/kafka-acl-extended/prefixed/"
USER_CONFIGS = "/config/users/"
BROKER_CONFIGS = "/config/brokers/"
DEFAULT_BROKER = "<default>"  # Kafka's ConfigEntityName.Default
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")

Update = Callable[[dict[str, Any] | None], dict[str, Any] | None]


def kafka_name(name: str) -> str:
    """An enum name as Kafka's ZooKeeper documents spell it: TRANSACTIONAL_ID -> TransactionalId."""
    return "".join(word.capitalize() for word in name.split("_"))


def enum_name(kafka: str) -> str:
    """The inverse of ``kafka_name``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kafka).upper()


def acl_key(doc: AclDoc) -> str:
    root = PREFIXED_ACLS if doc["pattern_type"] == "PREFIXED" else LITERAL_ACLS
    return f"{root}{kafka_name(doc['resource_type'])}/{doc['resource_name']}"


def _entry(doc: AclDoc) -> dict[str, str]:
    return {"principal": doc["principal"], "permissionType": kafka_name(doc["permission_type"]),
            "operations": kafka_name(doc["operation"]), "host": doc["host"]}


def decode_acls(key: str, value: bytes) -> list[AclDoc]:
    """One resource key's ACLs in the durable form; ValueError when malformed; [] for a key
    under the root that holds no ACLs (Kafka's change-notification paths)."""
    if key.startswith(PREFIXED_ACLS):
        pattern, tail = "PREFIXED", key[len(PREFIXED_ACLS):]
    elif key.startswith(LITERAL_ACLS):
        pattern, tail = "LITERAL", key[len(LITERAL_ACLS):]
    else:
        return []
    rtype, sep, name = tail.partition("/")
    if not sep or not name:
        raise ValueError(f"not a resource's ACL key: {key}")
    try:
        entries = json.loads(value)["acls"]
        return [{"resource_type": enum_name(rtype), "resource_name": name,
                 "pattern_type": pattern, "principal": str(e["principal"]),
                 "host": str(e["host"]), "operation": enum_name(str(e["operations"])),
                 "permission_type": enum_name(str(e["permissionType"]))} for e in entries]
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"malformed ACLs at {key}: {value!r}") from e


def encode_scram(creds: dict[str, Any]) -> str:
    return (f"salt={creds['salt']},stored_key={creds['stored_key']},"
            f"server_key={creds['server_key']},iterations={int(creds['iterations'])}")


def decode_scram(text: str) -> dict[str, Any]:
    """``salt=..,stored_key=..,server_key=..,iterations=N``; ValueError when malformed."""
    fields = dict(part.partition("=")[::2] for part in text.split(","))
    try:
        return {"salt": fields["salt"], "stored_key": fields["stored_key"],
                "server_key": fields["server_key"], "iterations": int(fields["iterations"])}
    except KeyError as e:
        raise ValueError(f"malformed SCRAM credential: missing {e}") from None


def decode_user(value: bytes) -> dict[str, dict[str, Any]]:
    """A user's SCRAM credentials by mechanism; ValueError when malformed."""
    try:
        config = json.loads(value)["config"]
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"malformed user config: {value!r}") from e
    return {m: decode_scram(str(config[m])) for m in SCRAM_MECHANISMS if m in config}


class _Follower(PrefixFollower):
    """A prefix's documents, decoded per key; malformed ones logged once and skipped."""

    def __init__(self, store: MetadataStore, prefix: str, decode: Callable[[str, bytes], Any],
                 on_change: Callable[[], None]) -> None:
        super().__init__(store)
        self.prefix = prefix
        self.description = f"shared state {prefix}"
        self.docs: dict[str, Any] = {}
        self._decode = decode
        self._on_change = on_change

    def _take(self, key: str, value: bytes) -> None:
        try:
            self.docs[key] = self._decode(key, value)
        except ValueError as e:
            logger.error("shared state key unreadable, skipped", key=key, error=str(e))
            self.docs.pop(key, None)

    def _listed(self, listing: Listing) -> None:
        self.docs.clear()
        for kv in listing.kvs:
            self._take(kv.key, kv.value)
        self._on_change()

    def _changed(self, event: WatchEvent) -> None:
        if event.type is EventType.DELETE:
            self.docs.pop(event.kv.key, None)
        else:
            self._take(event.kv.key, event.kv.value)
        self._on_change()

    async def relist(self) -> None:
        await self._relist()


class EtcdSharedState(SharedState):
    """A cluster broker's ACLs and SCRAM credentials; ``start()`` lists both."""

    def __init__(self, store: MetadataStore, *, write_attempts: int = 10,
                 retry_s: float = 0.2) -> None:
        super().__init__()
        self.store = store
        self._write_attempts = write_attempts
        self._retry_s = retry_s
        self._acls: list[AclDoc] = []
        self._scram: ScramCredentials = {}
        self.acl_view = _Follower(store, ACL_ROOT, decode_acls, self._acls_listed)
        self.user_view = _Follower(store, USER_CONFIGS, lambda _k, v: decode_user(v),
                                   self._users_listed)
        self._topics: dict[str, dict[str, str]] = {}
        self.topic_view = _Follower(store, TOPIC_CONFIGS, _decode_topic, self._topics_listed)
        self._brokers: dict[str, dict[str, str]] = {}
        self.broker_view = _Follower(store, BROKER_CONFIGS, _decode_config,
                                     self._brokers_listed)
        self._queue: asyncio.Queue[tuple[str, Update, Completion[None], _Follower]] = (
            asyncio.Queue())
        self._last: Completion[None] = Completion()
        self._last.set_result(None)
        self._writer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.acl_view.start()
        await self.user_view.start()
        await self.topic_view.start()
        await self.broker_view.start()
        self._writer = asyncio.get_running_loop().create_task(self._write_all(),
                                                              name="shared-state-writes")

    async def stop(self) -> None:
        await cancel_and_wait(self._writer)
        await self.acl_view.stop()
        await self.user_view.stop()
        await self.topic_view.stop()
        await self.broker_view.stop()

    # -- the view ------------------------------------------------------------------------------

    @property
    def acls(self) -> list[AclDoc]:
        return self._acls

    @property
    def scram_credentials(self) -> ScramCredentials:
        return self._scram

    def _acls_listed(self) -> None:
        self._acls = [doc for docs in self.acl_view.docs.values() for doc in docs]
        self._acls_changed()

    def _users_listed(self) -> None:
        self._scram = {key[len(USER_CONFIGS):]: creds
                       for key, creds in self.user_view.docs.items() if creds}

    def _topics_listed(self) -> None:
        now = {key[len(TOPIC_CONFIGS):]: configs
               for key, configs in self.topic_view.docs.items()}
        before, self._topics = self._topics, now
        for topic in before.keys() | now.keys():
            if before.get(topic) != now.get(topic):
                self._topic_configs_changed(topic, now.get(topic))

    def topic_overrides(self, topic: str) -> dict[str, str] | None:
        return self._topics.get(topic)

    def _brokers_listed(self) -> None:
        now = {_resource_of(key): configs for key, configs in self.broker_view.docs.items()}
        before, self._brokers = self._brokers, now
        for name in before.keys() | now.keys():
            if before.get(name, {}) != now.get(name, {}):
                self._broker_configs_changed(name, now.get(name, {}))

    def broker_configs(self, name: str) -> dict[str, str]:
        return dict(self._brokers.get(name, {}))

    # -- changes -------------------------------------------------------------------------------

    def change_acls(self, every: list[AclDoc], added: Iterable[AclDoc],
                    removed: Iterable[AclDoc]) -> None:
        self._acls = list(every)
        by_key: dict[str, tuple[list[AclDoc], list[AclDoc]]] = {}
        for doc in added:
            by_key.setdefault(acl_key(doc), ([], []))[0].append(doc)
        for doc in removed:
            by_key.setdefault(acl_key(doc), ([], []))[1].append(doc)
        for key, (plus, minus) in by_key.items():
            self._enqueue(key, _acl_update(key, plus, minus), self.acl_view)

    def change_scram(self, users: Mapping[str, dict[str, dict[str, Any]] | None]) -> None:
        for user, creds in users.items():
            if creds:
                self._scram[user] = dict(creds)
            else:
                self._scram.pop(user, None)
            self._enqueue(USER_CONFIGS + user, _user_update(creds or {}), self.user_view)

    def change_topic_configs(self, topic: str, configs: dict[str, str]) -> None:
        self._topics[topic] = dict(configs)
        self._enqueue(TOPIC_CONFIGS + topic, _topic_update(configs), self.topic_view)

    def change_broker_configs(self, name: str, overrides: dict[str, str]) -> None:
        self._brokers[name] = dict(overrides)
        self._enqueue(BROKER_CONFIGS + (name or DEFAULT_BROKER), _config_update(overrides),
                      self.broker_view)

    def flushed(self) -> Completion[None]:
        return self._last

    def _enqueue(self, key: str, update: Update, view: _Follower) -> None:
        done: Completion[None] = Completion()
        self._last = done
        self._queue.put_nowait((key, update, done, view))

    async def _write_all(self) -> None:
        while True:
            key, update, done, view = await self._queue.get()
            try:
                written = await self._write(key, update)
            except asyncio.CancelledError:
                done.set_exception(StoreError("broker shutting down"))
                raise
            except Exception as e:
                logger.error("shared state not written: view listed again", key=key,
                             error=str(e))
                done.set_exception(e)
                await self._relist(view)
                continue
            if not written:  # nothing to change there (a topic deleted meanwhile)
                await self._relist(view)
            done.set_result(None)

    async def _relist(self, view: _Follower) -> None:
        """The view as the store has it, once it answers (later changes wait for it)."""
        while True:
            try:
                await view.relist()
                return
            except StoreError:
                await asyncio.sleep(self._retry_s)

    async def _write(self, key: str, update: Update) -> bool:
        """Read, change, compare-and-swap on the version; again when another broker won.
        False when there was nothing to write (absent, and to stay absent)."""
        for _ in range(self._write_attempts):
            try:
                kv = await self.store.get(key)
                current = None if kv is None else json.loads(kv.value)
                new = update(current)
                compare = (Compare.absent(key) if kv is None
                           else Compare.version(key, "==", kv.version))
                ops = [Delete(key)] if new is None else [Put(key, json.dumps(new).encode())]
                if kv is None and new is None:
                    return False
                if (await self.store.txn([compare], ops)).succeeded:
                    return True
            except StoreError as e:
                logger.warning("shared state write failed, retrying", key=key, error=str(e))
                await asyncio.sleep(self._retry_s)
        raise StoreError(f"{key} not written in {self._write_attempts} attempts")


def _acl_update(key: str, added: list[AclDoc], removed: list[AclDoc]) -> Update:
    plus = [_entry(d) for d in added]
    minus = [_entry(d) for d in removed]

    def update(current: dict[str, Any] | None) -> dict[str, Any] | None:
        entries = [] if current is None else list(current.get("acls", []))
        entries = [e for e in entries if e not in minus]
        entries.extend(e for e in plus if e not in entries)
        return {"version": 1, "acls": entries} if entries else None

    return update


def _user_update(creds: dict[str, dict[str, Any]]) -> Update:
    def update(current: dict[str, Any] | None) -> dict[str, Any] | None:
        config = {} if current is None else dict(current.get("config", {}))
        for mechanism in SCRAM_MECHANISMS:
            config.pop(mechanism, None)
        config.update({m: encode_scram(c) for m, c in creds.items()})
        return {"version": 1, "config": config} if config else None

    return update


def _decode_topic(key: str, value: bytes) -> dict[str, str]:
    try:
        return decode_topic_config(key[len(TOPIC_CONFIGS):], value)
    except MalformedMetadata as e:
        raise ValueError(str(e)) from None


def _topic_update(configs: dict[str, str]) -> Update:
    def update(current: dict[str, Any] | None) -> dict[str, Any] | None:
        if current is None:
            return None  # the topic was deleted meanwhile: not made again
        return {"version": 1, "config": dict(configs)}

    return update


def _resource_of(key: str) -> str:
    """The BROKER resource name of a ``/config/brokers/<name>`` key ("" for the default)."""
    name = key[len(BROKER_CONFIGS):]
    return "" if name == DEFAULT_BROKER else name


def _decode_config(key: str, value: bytes) -> dict[str, str]:
    try:
        config = json.loads(value)["config"]
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"malformed config at {key}: {value!r}") from e
    if not isinstance(config, dict):
        raise ValueError(f"malformed config at {key}: {value!r}")
    return {str(k): str(v) for k, v in config.items()}


def _config_update(overrides: dict[str, str]) -> Update:
    def update(current: dict[str, Any] | None) -> dict[str, Any] | None:
        return {"version": 1, "config": dict(overrides)} if overrides else None

    return update
