"""ControlledShutdown (key 7): a broker about to stop asks the controller to move the
leadership of its partitions first (Kafka's ZooKeeper-era KafkaController.doControlledShutdown).

Needs CLUSTER_ACTION on the cluster (CLUSTER_AUTHORIZATION_FAILED otherwise, nothing moved). In
cluster mode the controller's TopicController marks the broker shutting down, gives each
partition it leads another live in-sync leader (leader epoch + 1, the broker out of the ISR),
takes it out of the ISR of those it follows, and answers the partitions it still leads; a
broker that is not the controller answers NOT_CONTROLLER, an unknown broker
BROKER_NOT_AVAILABLE, an older broker epoch STALE_BROKER_EPOCH, and a write etcd did not take
UNKNOWN_SERVER_ERROR (the shutting broker retries). A single broker is its own controller and
leads only partitions of one replica, which have nowhere to go and are not counted: it answers
NONE with nothing remaining for itself, BROKER_NOT_AVAILABLE for any other id. v0, whose request
header has no client id, is not served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from broker.apis.authorize import cluster_allowed
from broker.cluster.store import StoreError
from broker.cluster.topic_controller import ShutdownResult, TopicController
from broker.security.acl import AclOperation
from protocol.errors import ErrorCode
from protocol.messages import ControlledShutdownResponse

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 7  # ControlledShutdown
VERSIONS = range(1, 4)

logger = structlog.get_logger("broker.cluster")

Remaining = ControlledShutdownResponse.RemainingPartition


def response(result: ShutdownResult) -> ControlledShutdownResponse:
    return ControlledShutdownResponse(
        error_code=result.error_code,
        remaining_partitions=[Remaining(topic_name=t, partition_index=p)
                              for t, p in result.remaining])


def handle(ctx: ApiContext, request: Request) -> Any:
    req = request.body
    broker_epoch = getattr(req, "broker_epoch", -1)
    if not cluster_allowed(ctx, request, AclOperation.CLUSTER_ACTION):
        return response(ShutdownResult(ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
    cluster = ctx.cluster
    if cluster is None:
        if req.broker_id == ctx.node.node_id:
            return response(ShutdownResult())
        return response(ShutdownResult(ErrorCode.BROKER_NOT_AVAILABLE))

    async def work(controller: TopicController) -> ControlledShutdownResponse:
        try:
            return response(await controller.controlled_shutdown(req.broker_id, broker_epoch))
        except StoreError as e:
            logger.warning("controlled shutdown not written", broker=req.broker_id,
                           error=str(e))
            return response(ShutdownResult(ErrorCode.UNKNOWN_SERVER_ERROR))

    def moved() -> ControlledShutdownResponse:
        return response(ShutdownResult(ErrorCode.NOT_CONTROLLER))

    done = cluster.on_controller(work, moved)
    return moved() if done is None else done
