"""CreateTopics, CreatePartitions and DeleteTopics in cluster mode: done by the controller's
TopicController (one txn in etcd each), answered once etcd has answered.

A broker that is not the controller, or stops being it while the request runs
(ControllerMoved), answers NOT_CONTROLLER for every topic: Kafka's clients then refresh their
metadata and retry on the controller it names. Validation errors are Kafka's (the placement
raises Kafka's codes and messages). A topic whose write etcd could not take (unreachable, or
refused) answers REQUEST_TIMED_OUT, which clients retry. CreatePartitions takes a manual
assignment (checked as Kafka's controller does, ``placement.new_partitions_assignment``). The
handlers authorize first, as in single-node mode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import (
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
)

from broker.cluster.broker_node import ClusterNode, topic_id_text, topic_uuid
from broker.cluster.controller import ControllerMoved
from broker.cluster.placement import (
    PlacementError,
    assign_replicas,
    brokers_for_placement,
    validate_manual_assignment,
)
from broker.cluster.store import StoreError
from broker.cluster.topic_controller import TopicController, TopicResult
from broker.cluster.topic_state import topic_name_problem
from broker.metadata.file_store import validate_topic_configs
from broker.metadata.topic_admin import topic_defaults
from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext

NOT_CONTROLLER_MESSAGE = "This is not the correct controller for this cluster."

CreateResult = CreateTopicsResponse.CreatableTopicResult
ConfigResult = CreateResult.CreatableTopicConfigs
PartitionsResult = CreatePartitionsResponse.CreatePartitionsTopicResult
DeleteResult = DeleteTopicsResponse.DeletableTopicResult

Answer = Any  # a response, or the Completion of one


async def _or_timed_out(name: str, call: Awaitable[TopicResult]) -> TopicResult:
    """The controller's result; REQUEST_TIMED_OUT (retriable) when etcd could not be reached
    or refused, as Kafka's controller answers what it could not commit in time.
    ControllerMoved goes on up: NOT_CONTROLLER for the whole request."""
    try:
        return await call
    except ControllerMoved:
        raise
    except StoreError as e:
        return TopicResult(name, ErrorCode.REQUEST_TIMED_OUT,
                           f"The cluster metadata could not be written: {e}")


def _on_controller(cluster: ClusterNode, work: Callable[[TopicController], Any],
                   not_controller: Callable[[], Any]) -> Answer:
    done: Completion[Any] | None = cluster.on_controller(work, not_controller)
    return not_controller() if done is None else done


# -- CreateTopics ------------------------------------------------------------------------------

def create_topics(ctx: ApiContext, cluster: ClusterNode, topics: list[Any], validate_only: bool,
                  refused: list[Any], describable: set[str] | None) -> Answer:
    def not_controller() -> CreateTopicsResponse:
        return CreateTopicsResponse(throttle_time_ms=0, topics=[
            CreateResult(name=t.name, error_code=ErrorCode.NOT_CONTROLLER,
                         error_message=NOT_CONTROLLER_MESSAGE, num_partitions=-1,
                         replication_factor=-1, configs=None) for t in topics] + refused)

    async def work(controller: TopicController) -> CreateTopicsResponse:
        results = [await _create_one(ctx, cluster, controller, t, validate_only, describable)
                   for t in topics]
        return CreateTopicsResponse(throttle_time_ms=0, topics=results + refused)

    return _on_controller(cluster, work, not_controller)


async def _create_one(ctx: ApiContext, cluster: ClusterNode, controller: TopicController,
                      t: Any, validate_only: bool, describable: set[str] | None) -> Any:
    configs = {c.name: c.value for c in t.configs}
    defaults = topic_defaults(ctx.config)
    try:
        validate_topic_configs(configs, defaults)
        partitions, rf, assignment = _shape(ctx, t)
    except KafkaError as e:
        return _create_error(t.name, e.error_code, str(e))
    if validate_only:
        try:
            await controller.brokers_known()
        except StoreError as e:
            return _create_error(t.name, ErrorCode.REQUEST_TIMED_OUT, str(e))
        result = _validate_new_topic(cluster, controller, t.name, partitions, rf, assignment)
    else:
        result = await _or_timed_out(t.name, controller.create_topic(
            t.name, partitions, rf, configs=configs, assignment=assignment))
    if not result.ok:
        return _create_error(t.name, result.error_code, result.message)
    topic_id = topic_uuid(result.topic_id) if result.topic_id else None
    if describable is not None and t.name not in describable:
        return CreateResult(name=t.name, topic_id=topic_id, error_code=0, error_message=None,
                            topic_config_error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            num_partitions=-1, replication_factor=-1, configs=[])
    effective = {**defaults, **configs}
    return CreateResult(
        name=t.name, topic_id=topic_id, error_code=0, error_message=None,
        num_partitions=partitions, replication_factor=rf,
        configs=[ConfigResult(name=k, value=v, read_only=False,
                              config_source=1 if k in configs else 5, is_sensitive=False)
                 for k, v in effective.items()])


def _shape(ctx: ApiContext, t: Any) -> tuple[int, int, dict[int, list[int]] | None]:
    """Partition count, replication factor and manual assignment as the request gives them
    (-1: the broker's num.partitions / default.replication.factor)."""
    if t.assignments:
        check_manual_shape(t)
        assignment = {a.partition_index: list(a.broker_ids) for a in t.assignments}
        first = next(iter(assignment.values()))
        return len(assignment), len(first), assignment
    partitions = ctx.config["num.partitions"] if t.num_partitions == -1 else t.num_partitions
    rf = (ctx.config["default.replication.factor"] if t.replication_factor == -1
          else t.replication_factor)
    return partitions, rf, None


def check_manual_shape(t: Any) -> None:
    """A manual assignment leaves the counts at -1 (Kafka's words), else INVALID_REQUEST."""
    if t.replication_factor != -1:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "A manual partition assignment was "
                         "specified, but replication factor was not set to -1.")
    if t.num_partitions != -1:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "A manual partition assignment was "
                         "specified, but numPartitions was not set to -1.")


def _validate_new_topic(cluster: ClusterNode, controller: TopicController, name: str,
                        partitions: int, rf: int, assignment: dict[int, list[int]] | None
                        ) -> TopicResult:
    """What create_topic would refuse, nothing written (validate_only)."""
    problem = topic_name_problem(name)
    if problem is not None:
        return TopicResult(name, ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
    if cluster.cache.topic(name) is not None:
        return TopicResult(name, ErrorCode.TOPIC_ALREADY_EXISTS,
                           f"Topic '{name}' already exists.")
    try:
        if assignment is not None:
            validate_manual_assignment(assignment.items(), set(controller.liveness.live))
        else:
            brokers = brokers_for_placement(controller.liveness.placement_brokers(),
                                            controller.rack_aware_mode)
            assign_replicas(brokers, partitions, rf)
    except PlacementError as e:
        return TopicResult(name, e.error_code, e.message)
    return TopicResult(name)


def _create_error(name: str, code: int, message: str | None) -> Any:
    return CreateResult(name=name, error_code=code, error_message=message, num_partitions=-1,
                        replication_factor=-1, configs=None)


# -- CreatePartitions --------------------------------------------------------------------------

def create_partitions(cluster: ClusterNode, topics: list[Any], validate_only: bool,
                      refused: list[Any]) -> Answer:
    def not_controller() -> CreatePartitionsResponse:
        return CreatePartitionsResponse(throttle_time_ms=0, results=refused + [
            PartitionsResult(name=t.name, error_code=ErrorCode.NOT_CONTROLLER,
                             error_message=NOT_CONTROLLER_MESSAGE) for t in topics])

    async def work(controller: TopicController) -> CreatePartitionsResponse:
        results = list(refused)
        for t in topics:
            assignments = ([list(a.broker_ids) for a in t.assignments]
                           if t.assignments is not None else None)
            result = await _or_timed_out(t.name, controller.create_partitions(
                t.name, t.count, assignments, validate_only=validate_only))
            results.append(PartitionsResult(name=t.name, error_code=result.error_code,
                                            error_message=result.message))
        return CreatePartitionsResponse(throttle_time_ms=0, results=results)

    return _on_controller(cluster, work, not_controller)


# -- DeleteTopics ------------------------------------------------------------------------------

def delete_topic_name(cluster: ClusterNode, topic_id: Any) -> str | None:
    """The name of the topic of this id in the cluster, None when unknown."""
    return cluster.cache.topic_name_of(topic_id_text(topic_id)) if topic_id else None


def delete_topics(cluster: ClusterNode, names: list[str], done: list[Any]) -> Answer:
    """Delete ``names`` (authorized already); ``done`` are the answers decided before."""
    def not_controller() -> DeleteTopicsResponse:
        return DeleteTopicsResponse(throttle_time_ms=0, responses=done + [
            DeleteResult(name=n, topic_id=_id_of(cluster, n), error_code=ErrorCode.NOT_CONTROLLER,
                         error_message=NOT_CONTROLLER_MESSAGE) for n in names])

    async def work(controller: TopicController) -> DeleteTopicsResponse:
        results = list(done)
        for name in names:
            topic_id = _id_of(cluster, name)
            result = await _or_timed_out(name, controller.delete_topic(name))
            results.append(DeleteResult(name=name, topic_id=topic_id,
                                        error_code=result.error_code,
                                        error_message=result.message))
        return DeleteTopicsResponse(throttle_time_ms=0, responses=results)

    return _on_controller(cluster, work, not_controller)


def _id_of(cluster: ClusterNode, name: str) -> Any:
    topic = cluster.cache.topic(name)
    return topic_uuid(topic.topic_id) if topic is not None else None
