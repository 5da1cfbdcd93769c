"""Every broker configuration key Kafka defines, as data: what mini-broker accepts with a
warning when it does not use the key, and what separates a Kafka key from a typo.

Read from apache/kafka's source at commit 1eb7644349cb (4.0.0-SNAPSHOT, 2024-10-25): the keys of
the ConfigDefs that AbstractKafkaConfig.CONFIG_DEF merges (LogConfig's SERVER_CONFIG_DEF and
QuotaConfig's CONFIG_DEF only), plus RemoteLogManagerConfig's and the two keys
StandardAuthorizer reads. ZooKeeper's keys (ZkConfigs,
zookeeper.*) are left out: Kafka 4 has no ZooKeeper mode. Grouped by the Kafka class that
defines them.
"""

from __future__ import annotations

SERVER_CONFIGS: tuple[str, ...] = (
    "authorizer.class.name",
    "background.threads",
    "broker.id",
    "broker.id.generation.enable",
    "broker.rack",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.type",
    "compression.zstd.level",
    "controlled.shutdown.enable",
    "controlled.shutdown.max.retries",
    "controlled.shutdown.retry.backoff.ms",
    "delete.topic.enable",
    "early.start.listeners",
    "fetch.max.bytes",
    "max.incremental.fetch.session.cache.slots",
    "max.request.partition.size.limit",
    "message.max.bytes",
    "num.io.threads",
    "num.replica.alter.log.dirs.threads",
    "request.timeout.ms",
    "reserved.broker.max.id",
    "socket.connection.setup.timeout.max.ms",
    "socket.connection.setup.timeout.ms",
    "unstable.api.versions.enable",
    "unstable.feature.versions.enable",
)

KRAFT_CONFIGS: tuple[str, ...] = (
    "broker.heartbeat.interval.ms",
    "broker.session.timeout.ms",
    "controller.listener.names",
    "eligible.leader.replicas.enable",
    "initial.broker.registration.timeout.ms",
    "metadata.log.dir",
    "metadata.log.max.record.bytes.between.snapshots",
    "metadata.log.max.snapshot.interval.ms",
    "metadata.log.segment.bytes",
    "metadata.log.segment.min.bytes",
    "metadata.log.segment.ms",
    "metadata.max.idle.interval.ms",
    "metadata.max.retention.bytes",
    "metadata.max.retention.ms",
    "node.id",
    "process.roles",
    "sasl.mechanism.controller.protocol",
    "server.max.startup.time.ms",
)

SOCKET_SERVER_CONFIGS: tuple[str, ...] = (
    "advertised.listeners",
    "connection.failed.authentication.delay.ms",
    "connections.max.idle.ms",
    "control.plane.listener.name",
    "listener.security.protocol.map",
    "listeners",
    "max.connection.creation.rate",
    "max.connections",
    "max.connections.per.ip",
    "max.connections.per.ip.overrides",
    "num.network.threads",
    "queued.max.request.bytes",
    "queued.max.requests",
    "socket.listen.backlog.size",
    "socket.receive.buffer.bytes",
    "socket.request.max.bytes",
    "socket.send.buffer.bytes",
)

REPLICATION_CONFIGS: tuple[str, ...] = (
    "auto.leader.rebalance.enable",
    "controller.socket.timeout.ms",
    "default.replication.factor",
    "delete.records.purgatory.purge.interval.requests",
    "fetch.purgatory.purge.interval.requests",
    "inter.broker.listener.name",
    "inter.broker.protocol.version",
    "leader.imbalance.check.interval.seconds",
    "leader.imbalance.per.broker.percentage",
    "num.replica.fetchers",
    "producer.purgatory.purge.interval.requests",
    "replica.fetch.backoff.ms",
    "replica.fetch.max.bytes",
    "replica.fetch.min.bytes",
    "replica.fetch.response.max.bytes",
    "replica.fetch.wait.max.ms",
    "replica.high.watermark.checkpoint.interval.ms",
    "replica.lag.time.max.ms",
    "replica.selector.class",
    "replica.socket.receive.buffer.bytes",
    "replica.socket.timeout.ms",
    "security.inter.broker.protocol",
    "unclean.leader.election.enable",
    "unclean.leader.election.interval.ms",
)

GROUP_COORDINATOR_CONFIG: tuple[str, ...] = (
    "group.consumer.assignors",
    "group.consumer.heartbeat.interval.ms",
    "group.consumer.max.heartbeat.interval.ms",
    "group.consumer.max.session.timeout.ms",
    "group.consumer.max.size",
    "group.consumer.migration.policy",
    "group.consumer.min.heartbeat.interval.ms",
    "group.consumer.min.session.timeout.ms",
    "group.consumer.session.timeout.ms",
    "group.coordinator.append.linger.ms",
    "group.coordinator.new.enable",
    "group.coordinator.rebalance.protocols",
    "group.coordinator.threads",
    "group.initial.rebalance.delay.ms",
    "group.max.session.timeout.ms",
    "group.max.size",
    "group.min.session.timeout.ms",
    "group.share.heartbeat.interval.ms",
    "group.share.max.heartbeat.interval.ms",
    "group.share.max.session.timeout.ms",
    "group.share.max.size",
    "group.share.min.heartbeat.interval.ms",
    "group.share.min.session.timeout.ms",
    "group.share.session.timeout.ms",
    "offset.metadata.max.bytes",
    "offsets.commit.timeout.ms",
    "offsets.load.buffer.size",
    "offsets.retention.check.interval.ms",
    "offsets.retention.minutes",
    "offsets.topic.compression.codec",
    "offsets.topic.num.partitions",
    "offsets.topic.replication.factor",
    "offsets.topic.segment.bytes",
)

CLEANER_CONFIG: tuple[str, ...] = (
    "log.cleaner.backoff.ms",
    "log.cleaner.dedupe.buffer.size",
    "log.cleaner.delete.retention.ms",
    "log.cleaner.enable",
    "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.buffer.size",
    "log.cleaner.io.max.bytes.per.second",
    "log.cleaner.max.compaction.lag.ms",
    "log.cleaner.min.cleanable.ratio",
    "log.cleaner.min.compaction.lag.ms",
    "log.cleaner.threads",
)

LOG_CONFIG: tuple[str, ...] = (
    "alter.config.policy.class.name",
    "auto.create.topics.enable",
    "create.topic.policy.class.name",
    "log.cleanup.policy",
    "log.dir",
    "log.dir.failure.timeout.ms",
    "log.dirs",
    "log.flush.interval.messages",
    "log.flush.interval.ms",
    "log.flush.offset.checkpoint.interval.ms",
    "log.flush.scheduler.interval.ms",
    "log.flush.start.offset.checkpoint.interval.ms",
    "log.index.interval.bytes",
    "log.index.size.max.bytes",
    "log.initial.task.delay.ms",
    "log.message.downconversion.enable",
    "log.message.format.version",
    "log.message.timestamp.after.max.ms",
    "log.message.timestamp.before.max.ms",
    "log.message.timestamp.difference.max.ms",
    "log.message.timestamp.type",
    "log.preallocate",
    "log.retention.bytes",
    "log.retention.check.interval.ms",
    "log.retention.hours",
    "log.retention.minutes",
    "log.retention.ms",
    "log.roll.hours",
    "log.roll.jitter.hours",
    "log.roll.jitter.ms",
    "log.roll.ms",
    "log.segment.bytes",
    "log.segment.delete.delay.ms",
    "min.insync.replicas",
    "num.partitions",
    "num.recovery.threads.per.data.dir",
)

SHARE_GROUP_CONFIG: tuple[str, ...] = (
    "group.share.delivery.count.limit",
    "group.share.enable",
    "group.share.max.groups",
    "group.share.max.record.lock.duration.ms",
    "group.share.min.record.lock.duration.ms",
    "group.share.partition.max.record.locks",
    "group.share.record.lock.duration.ms",
    "share.fetch.max.fetch.records",
    "share.fetch.purgatory.purge.interval.requests",
)

SHARE_COORDINATOR_CONFIG: tuple[str, ...] = (
    "share.coordinator.append.linger.ms",
    "share.coordinator.load.buffer.size",
    "share.coordinator.snapshot.update.records.per.snapshot",
    "share.coordinator.state.topic.compression.codec",
    "share.coordinator.state.topic.min.isr",
    "share.coordinator.state.topic.num.partitions",
    "share.coordinator.state.topic.replication.factor",
    "share.coordinator.state.topic.segment.bytes",
    "share.coordinator.threads",
    "share.coordinator.write.timeout.ms",
)

TRANSACTION_LOG_CONFIG: tuple[str, ...] = (
    "producer.id.expiration.check.interval.ms",
    "producer.id.expiration.ms",
    "transaction.partition.verification.enable",
    "transaction.state.log.load.buffer.size",
    "transaction.state.log.min.isr",
    "transaction.state.log.num.partitions",
    "transaction.state.log.replication.factor",
    "transaction.state.log.segment.bytes",
)

TRANSACTION_STATE_MANAGER_CONFIG: tuple[str, ...] = (
    "transaction.abort.timed.out.transaction.cleanup.interval.ms",
    "transaction.max.timeout.ms",
    "transaction.remove.expired.transaction.cleanup.interval.ms",
    "transactional.id.expiration.ms",
)

QUORUM_CONFIG: tuple[str, ...] = (
    "controller.quorum.append.linger.ms",
    "controller.quorum.bootstrap.servers",
    "controller.quorum.election.backoff.max.ms",
    "controller.quorum.election.timeout.ms",
    "controller.quorum.fetch.timeout.ms",
    "controller.quorum.request.timeout.ms",
    "controller.quorum.retry.backoff.ms",
    "controller.quorum.voters",
)

METRIC_CONFIGS: tuple[str, ...] = (
    "kafka.metrics.polling.interval.secs",
    "kafka.metrics.reporters",
    "metric.reporters",
    "metrics.num.samples",
    "metrics.recording.level",
    "metrics.sample.window.ms",
    "telemetry.max.bytes",
)

QUOTA_CONFIG: tuple[str, ...] = (
    "alter.log.dirs.replication.quota.window.num",
    "alter.log.dirs.replication.quota.window.size.seconds",
    "client.quota.callback.class",
    "controller.quota.window.num",
    "controller.quota.window.size.seconds",
    "quota.window.num",
    "quota.window.size.seconds",
    "replication.quota.window.num",
    "replication.quota.window.size.seconds",
)

BROKER_SECURITY_CONFIGS: tuple[str, ...] = (
    "connections.max.reauth.ms",
    "principal.builder.class",
    "sasl.client.callback.handler.class",
    "sasl.enabled.mechanisms",
    "sasl.jaas.config",
    "sasl.kerberos.kinit.cmd",
    "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.principal.to.local.rules",
    "sasl.kerberos.service.name",
    "sasl.kerberos.ticket.renew.jitter",
    "sasl.kerberos.ticket.renew.window.factor",
    "sasl.login.callback.handler.class",
    "sasl.login.class",
    "sasl.login.connect.timeout.ms",
    "sasl.login.read.timeout.ms",
    "sasl.login.refresh.buffer.seconds",
    "sasl.login.refresh.min.period.seconds",
    "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter",
    "sasl.login.retry.backoff.max.ms",
    "sasl.login.retry.backoff.ms",
    "sasl.mechanism.inter.broker.protocol",
    "sasl.oauthbearer.clock.skew.seconds",
    "sasl.oauthbearer.expected.audience",
    "sasl.oauthbearer.expected.issuer",
    "sasl.oauthbearer.jwks.endpoint.refresh.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms",
    "sasl.oauthbearer.jwks.endpoint.url",
    "sasl.oauthbearer.scope.claim.name",
    "sasl.oauthbearer.sub.claim.name",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.server.callback.handler.class",
    "sasl.server.max.receive.size",
    "security.providers",
    "ssl.allow.dn.changes",
    "ssl.allow.san.changes",
    "ssl.cipher.suites",
    "ssl.client.auth",
    "ssl.enabled.protocols",
    "ssl.endpoint.identification.algorithm",
    "ssl.engine.factory.class",
    "ssl.key.password",
    "ssl.keymanager.algorithm",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.keystore.type",
    "ssl.principal.mapping.rules",
    "ssl.protocol",
    "ssl.provider",
    "ssl.secure.random.implementation",
    "ssl.trustmanager.algorithm",
    "ssl.truststore.certificates",
    "ssl.truststore.location",
    "ssl.truststore.password",
    "ssl.truststore.type",
)

DELEGATION_TOKEN_MANAGER_CONFIGS: tuple[str, ...] = (
    "delegation.token.expiry.check.interval.ms",
    "delegation.token.expiry.time.ms",
    "delegation.token.max.lifetime.ms",
    "delegation.token.secret.key",
)

PASSWORD_ENCODER_CONFIGS: tuple[str, ...] = (
    "password.encoder.cipher.algorithm",
    "password.encoder.iterations",
    "password.encoder.key.length",
    "password.encoder.keyfactory.algorithm",
    "password.encoder.old.secret",
    "password.encoder.secret",
)

REMOTE_LOG_MANAGER_CONFIG: tuple[str, ...] = (
    "log.local.retention.bytes",
    "log.local.retention.ms",
    "remote.fetch.max.wait.ms",
    "remote.list.offsets.request.timeout.ms",
    "remote.log.index.file.cache.total.size.bytes",
    "remote.log.manager.copier.thread.pool.size",
    "remote.log.manager.copy.max.bytes.per.second",
    "remote.log.manager.copy.quota.window.num",
    "remote.log.manager.copy.quota.window.size.seconds",
    "remote.log.manager.expiration.thread.pool.size",
    "remote.log.manager.fetch.max.bytes.per.second",
    "remote.log.manager.fetch.quota.window.num",
    "remote.log.manager.fetch.quota.window.size.seconds",
    "remote.log.manager.task.interval.ms",
    "remote.log.manager.task.retry.backoff.max.ms",
    "remote.log.manager.task.retry.backoff.ms",
    "remote.log.manager.task.retry.jitter",
    "remote.log.manager.thread.pool.size",
    "remote.log.metadata.custom.metadata.max.bytes",
    "remote.log.metadata.manager.class.name",
    "remote.log.metadata.manager.class.path",
    "remote.log.metadata.manager.impl.prefix",
    "remote.log.metadata.manager.listener.name",
    "remote.log.reader.max.pending.tasks",
    "remote.log.reader.threads",
    "remote.log.storage.manager.class.name",
    "remote.log.storage.manager.class.path",
    "remote.log.storage.manager.impl.prefix",
    "remote.log.storage.system.enable",
)

# Not in a ConfigDef: StandardAuthorizer reads these from the broker's properties.
STANDARD_AUTHORIZER: tuple[str, ...] = (
    "allow.everyone.if.no.acl.found",
    "super.users",
)

KAFKA_BROKER_KEYS: frozenset[str] = frozenset(
    SERVER_CONFIGS
    + KRAFT_CONFIGS
    + SOCKET_SERVER_CONFIGS
    + REPLICATION_CONFIGS
    + GROUP_COORDINATOR_CONFIG
    + CLEANER_CONFIG
    + LOG_CONFIG
    + SHARE_GROUP_CONFIG
    + SHARE_COORDINATOR_CONFIG
    + TRANSACTION_LOG_CONFIG
    + TRANSACTION_STATE_MANAGER_CONFIG
    + QUORUM_CONFIG
    + METRIC_CONFIGS
    + QUOTA_CONFIG
    + BROKER_SECURITY_CONFIGS
    + DELEGATION_TOKEN_MANAGER_CONFIGS
    + PASSWORD_ENCODER_CONFIGS
    + REMOTE_LOG_MANAGER_CONFIG
    + STANDARD_AUTHORIZER
)
