"""A broker's side of controlled shutdown (Kafka's KafkaServer.controlledShutdown): before it
stops, the broker asks the controller to move the leadership of its partitions away, with
ControlledShutdown over the inter-broker client, or to its own controller when it is the
controller; it tries ``controlled.shutdown.max.retries`` times,
``controlled.shutdown.retry.backoff.ms`` apart, until the controller answers that it leads
nothing more, then stops either way (Kafka's "unclean shutdown" after the last attempt: the
controller then elects when the broker's registration goes).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from broker.cluster.broker_node import ClusterNode
from broker.cluster.controller import ControllerMoved
from broker.cluster.store import StoreError
from broker.cluster.topic_controller import ShutdownResult
from broker.interbroker.client import InterBrokerError
from protocol.errors import ErrorCode
from protocol.messages import ControlledShutdownRequest

logger = structlog.get_logger("broker.cluster")

CONTROLLED_SHUTDOWN_KEY = 7
NEWEST_VERSION = 3


async def controlled_shutdown(cluster: ClusterNode, max_retries: int = 3,
                              retry_backoff_ms: int = 5000) -> bool:
    """True once the controller answered that this broker leads no partition of more than
    one replica; False when every attempt failed (the caller stops anyway)."""
    if not replicated_here(cluster):
        # The controller would answer that nothing remains and write nothing: a partition of
        # one replica has nowhere to go, and there is no ISR to leave.
        logger.info("controlled shutdown: no replicated partition here, nothing to move")
        return True
    for attempt in range(1, max_retries + 1):
        result = await _ask(cluster)
        if result is not None and result.error_code is ErrorCode.NONE and not result.remaining:
            logger.info("controlled shutdown succeeded", attempt=attempt)
            return True
        if result is not None:
            logger.info("controlled shutdown incomplete", attempt=attempt,
                        error=result.error_code.name,
                        remaining=[f"{t}-{p}" for t, p in result.remaining])
        if attempt < max_retries:
            logger.info("retrying controlled shutdown", retries_left=max_retries - attempt)
            await asyncio.sleep(retry_backoff_ms / 1000)
    logger.warning("proceeding to do an unclean shutdown as all the controlled shutdown "
                   "attempts failed", attempts=max_retries)
    return False


def replicated_here(cluster: ClusterNode) -> bool:
    """Whether this broker is a replica of a partition with more than one replica, as its
    metadata cache has the partitions."""
    node = cluster.node_id
    return any(len(p.replicas) > 1 and node in p.replicas
               for topic in cluster.cache.topics() for p in topic.partitions.values())


def request(version: int, broker_id: int, broker_epoch: int) -> Any:
    """ControlledShutdown for ``broker_id`` (its epoch from v2)."""
    versions: Any = ControlledShutdownRequest  # built from its spec: indexed by version
    return versions[version](broker_id=broker_id, broker_epoch=broker_epoch)


async def _ask(cluster: ClusterNode) -> ShutdownResult | None:
    """One attempt; None when no controller could be asked."""
    registration = cluster.membership.registration
    epoch = registration.epoch if registration is not None else None
    broker_epoch = -1 if epoch is None else epoch
    controller = cluster.controller
    try:
        if controller is not None:
            return await controller.controlled_shutdown(cluster.node_id, broker_epoch)
        controller_id = cluster.controller_id
        if controller_id < 0 or cluster.client is None:
            logger.info("controlled shutdown: no controller known")
            return None
        response = await cluster.client.send(
            controller_id, CONTROLLED_SHUTDOWN_KEY,
            lambda version: request(version, cluster.node_id, broker_epoch), NEWEST_VERSION)
    except ControllerMoved:
        return ShutdownResult(ErrorCode.NOT_CONTROLLER)
    except (StoreError, InterBrokerError) as e:
        logger.info("controlled shutdown attempt failed", error=str(e))
        return None
    return ShutdownResult(
        ErrorCode(response.error_code),
        remaining=tuple((r.topic_name, r.partition_index) for r in response.remaining_partitions))
