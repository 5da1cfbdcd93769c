"""What every broker of a cluster must see the same: the ACLs, the SCRAM credentials, the
topics' config overrides and the dynamic broker configs.

One interface, two implementations. A single broker keeps both in its metadata file
(``LocalSharedState``: a change is saved before it returns). In cluster mode they live in
etcd, where Kafka's ZooKeeper era kept them in ZooKeeper (``broker.cluster.shared_state``): a
change is applied to this broker's view at once and written to etcd in the background, and
every broker follows the keys with a watch, telling the owners when the view changed.

The owners (the authorizer, the SCRAM credential store, TopicAdmin, DynamicBrokerConfig) read
the view and change it
through this interface only; a handler that changed something answers once ``flushed()`` is done, so
an acknowledged change is durable where the state lives.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from broker.metadata.file_store import MetadataStore
from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode

T = TypeVar("T")
AclDoc = dict[str, Any]  # one ACL binding's durable form (AclBinding.to_json)
#: user -> mechanism name -> {"salt", "stored_key", "server_key" (base64), "iterations"}
ScramCredentials = dict[str, dict[str, dict[str, Any]]]


class SharedState(ABC):
    """The ACLs and SCRAM credentials as this broker sees them, and the way to change them."""

    def __init__(self) -> None:
        self._acl_listeners: list[Callable[[], None]] = []
        self._topic_listeners: list[Callable[[str, dict[str, str] | None], None]] = []
        self._broker_listeners: list[Callable[[str, dict[str, str]], None]] = []

    @property
    @abstractmethod
    def acls(self) -> list[AclDoc]:
        """Every ACL binding."""

    @property
    @abstractmethod
    def scram_credentials(self) -> ScramCredentials:
        """Every user's credentials (read only: change them with ``change_scram``)."""

    @abstractmethod
    def change_acls(self, every: list[AclDoc], added: Iterable[AclDoc],
                    removed: Iterable[AclDoc]) -> None:
        """The ACLs are now ``every``: ``added`` and ``removed`` are what changed (a store
        shared by brokers applies the difference, not the whole). May raise when the change
        could not be saved (nothing changed then)."""

    @abstractmethod
    def change_scram(self, users: Mapping[str, dict[str, dict[str, Any]] | None]) -> None:
        """Each named user's credentials replaced (None or empty: the user has none)."""

    @abstractmethod
    def topic_overrides(self, topic: str) -> dict[str, str] | None:
        """A topic's own configs; None when there is no such topic."""

    @abstractmethod
    def change_topic_configs(self, topic: str, configs: dict[str, str]) -> None:
        """Replace an existing topic's overrides (AlterConfigs, IncrementalAlterConfigs)."""

    @abstractmethod
    def broker_configs(self, name: str) -> dict[str, str]:
        """A BROKER resource's dynamic overrides ("" the cluster default, else a node id)."""

    @abstractmethod
    def change_broker_configs(self, name: str, overrides: dict[str, str]) -> None:
        """Replace a BROKER resource's overrides. May raise when they could not be saved
        (nothing changed then)."""

    @abstractmethod
    def flushed(self) -> Completion[None]:
        """Done once every change made so far is durable (failed: one could not be saved)."""

    def answer(self, response: T) -> T | Completion[T]:
        """``response`` once every change made so far is durable: at once when it is (a
        single broker's), else later. When a write failed (etcd unreachable) every entry
        the response answered NONE answers REQUEST_TIMED_OUT instead, retriable, as Kafka's
        brokers answer a change the controller did not commit in time (their forwarding
        timeout); entries refused before any write keep their own error."""
        flushed = self.flushed()
        if flushed.done() and flushed.exception() is None:
            return response
        done: Completion[T] = Completion()

        def finished(c: Completion[None]) -> None:
            error = c.exception()
            if error is not None:
                not_written(response, f"The change was not stored: {error}")
            done.set_result(response)

        flushed.on_done(finished)
        return done

    def on_acls_changed(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs when the ACLs changed other than through ``change_acls`` here
        (another broker's change)."""
        self._acl_listeners.append(listener)

    def _acls_changed(self) -> None:
        for listener in self._acl_listeners:
            listener()

    def on_topic_configs_changed(self, listener: Callable[[str, dict[str, str] | None], None]
                                 ) -> None:
        """``listener(topic, overrides)`` runs when a topic's overrides changed elsewhere
        (None: the topic is gone)."""
        self._topic_listeners.append(listener)

    def _topic_configs_changed(self, topic: str, configs: dict[str, str] | None) -> None:
        for listener in self._topic_listeners:
            listener(topic, configs)

    def on_broker_configs_changed(self, listener: Callable[[str, dict[str, str]], None]
                                  ) -> None:
        """``listener(name, overrides)`` runs when a BROKER resource's overrides changed
        elsewhere (another broker altered the cluster default)."""
        self._broker_listeners.append(listener)

    def _broker_configs_changed(self, name: str, overrides: dict[str, str]) -> None:
        for listener in self._broker_listeners:
            listener(name, overrides)


def completed_none() -> Completion[None]:
    done: Completion[None] = Completion()
    done.set_result(None)
    return done


class LocalSharedState(SharedState):
    """A single broker's: in its metadata file, saved (written and fsynced) before a change
    returns."""

    def __init__(self, metadata: MetadataStore) -> None:
        super().__init__()
        self.metadata = metadata

    @property
    def acls(self) -> list[AclDoc]:
        return self.metadata.acls

    @property
    def scram_credentials(self) -> ScramCredentials:
        return self.metadata.scram_credentials

    def change_acls(self, every: list[AclDoc], added: Iterable[AclDoc],
                    removed: Iterable[AclDoc]) -> None:
        before = self.metadata.acls
        self.metadata.acls = every
        try:
            self.metadata.save()
        except BaseException:
            self.metadata.acls = before
            raise

    def change_scram(self, users: Mapping[str, dict[str, dict[str, Any]] | None]) -> None:
        stored = self.metadata.scram_credentials
        for user, creds in users.items():
            if creds:
                stored[user] = dict(creds)
            else:
                stored.pop(user, None)
        self.metadata.save()

    def topic_overrides(self, topic: str) -> dict[str, str] | None:
        info = self.metadata.topics.get(topic)
        return None if info is None else info.configs

    def change_topic_configs(self, topic: str, configs: dict[str, str]) -> None:
        self.metadata.set_configs(topic, configs)

    def broker_configs(self, name: str) -> dict[str, str]:
        return dict(self.metadata.broker_configs.get(name, {}))

    def change_broker_configs(self, name: str, overrides: dict[str, str]) -> None:
        stored = self.metadata.broker_configs
        before = stored.get(name)
        stored[name] = dict(overrides)
        try:
            self.metadata.save()
        except BaseException:
            if before is None:
                stored.pop(name, None)
            else:
                stored[name] = before
            raise

    def flushed(self) -> Completion[None]:
        return completed_none()


def shared_state_of(source: SharedState | MetadataStore) -> SharedState:
    """The shared state an owner is given: a metadata file means a single broker's."""
    return source if isinstance(source, SharedState) else LocalSharedState(source)


def not_written(response: Any, message: str) -> None:
    """Every entry of ``response`` (a struct with ``error_code``, in the lists of its fields,
    at any depth) that answered NONE made to answer REQUEST_TIMED_OUT with ``message``."""
    for value in [getattr(response, name, None) for name in _field_names(response)]:
        if not isinstance(value, list):
            continue
        for entry in value:
            if isinstance(entry, int | str | bytes) or entry is None:
                continue
            if getattr(entry, "error_code", None) == ErrorCode.NONE:
                entry.error_code = int(ErrorCode.REQUEST_TIMED_OUT)
                if hasattr(entry, "error_message"):
                    entry.error_message = message
            not_written(entry, message)


def _field_names(struct: Any) -> list[str]:
    """A response struct's field names (slotted protocol classes, or plain objects)."""
    names = [n for cls in type(struct).__mro__ for n in getattr(cls, "__slots__", ())
             if isinstance(n, str)]
    return names + list(getattr(struct, "__dict__", {}))
