"""The API registry: each API's codecs, and the versions they decode.

What is served is declared by each API module at its top (broker/apis/<api>.py: API_KEY,
VERSIONS); this table keeps the same ranges for the layers below the APIs (the connection and
SASL refuse what is not in it, ApiVersions answers from it), and broker.apis refuses to import
when the two disagree. Codecs are kafka-python's classes generated from Kafka's own
JSON message specs, so request and response layouts are exactly Kafka's; the few APIs the
pinned kafka-python lacks are built the same way from spec files in protocol/messages. Produce,
on every request's path, has a hand-written decoder (protocol/produce_codec.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from protocol.messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    GetTelemetrySubscriptionsRequest,
    GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest,
    PushTelemetryResponse,
)
from protocol.produce_codec import ProduceRequestCodec


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """One served API: its key, the version range we answer, and its codecs."""

    key: int
    name: str
    min_version: int
    max_version: int
    request: type[ApiMessage]
    response: type[ApiMessage]
    advertised_min: int  # what ApiVersions says; below min_version requests are still refused

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def flexible(self, version: int) -> bool:
        """Flexible versions use request header v2 / response header v1 (tagged fields)."""
        return self.request.flexible_version_q(version)


def _spec(
    min_v: int, max_v: int, req: type[ApiMessage], resp: type[ApiMessage],
    advertised_min: int | None = None,
) -> ApiSpec:
    name = req.name.removesuffix("Request")
    adv = min_v if advertised_min is None else advertised_min
    return ApiSpec(req.API_KEY, name, min_v, max_v, req, resp, adv)


APIS: dict[int, ApiSpec] = {
    s.key: s
    for s in (
        # Produce is advertised from v0 as Kafka 4 does: librdkafka before 2.x
        # otherwise refuses to compress at all. v0-v2 requests are still refused.
        # Its requests are decoded by hand (protocol/produce_codec.py): records without a copy.
        _spec(3, 11, ProduceRequestCodec, ProduceResponse, advertised_min=0),
        _spec(4, 16, FetchRequest, FetchResponse),
        _spec(1, 8, ListOffsetsRequest, ListOffsetsResponse),
        _spec(0, 12, MetadataRequest, MetadataResponse),
        # v4 only lets SupportedFeatures.MinVersion be 0; no features are advertised here.
        _spec(0, 4, ApiVersionsRequest, ApiVersionsResponse),
        _spec(2, 7, CreateTopicsRequest, CreateTopicsResponse),
        _spec(1, 6, DeleteTopicsRequest, DeleteTopicsResponse),
        _spec(1, 4, DescribeConfigsRequest, DescribeConfigsResponse),
        _spec(0, 2, AlterConfigsRequest, AlterConfigsResponse),
        _spec(0, 1, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse),
        _spec(0, 2, DeleteRecordsRequest, DeleteRecordsResponse),
        # Kafka 4 serves 1-4 (v0 was removed with the old message formats).
        _spec(1, 4, DescribeLogDirsRequest, DescribeLogDirsResponse),
        _spec(0, 0, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse),
        _spec(2, 4, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse),
        _spec(0, 3, CreatePartitionsRequest, CreatePartitionsResponse),
        _spec(0, 1, DescribeClusterRequest, DescribeClusterResponse),
        # v0's request header has no client id (a form no other API uses): not served.
        _spec(1, 3, ControlledShutdownRequest, ControlledShutdownResponse),
        _spec(0, 2, ElectLeadersRequest, ElectLeadersResponse),
        _spec(0, 5, FindCoordinatorRequest, FindCoordinatorResponse),
        _spec(0, 9, JoinGroupRequest, JoinGroupResponse),
        _spec(0, 5, SyncGroupRequest, SyncGroupResponse),
        _spec(0, 4, HeartbeatRequest, HeartbeatResponse),
        _spec(0, 5, LeaveGroupRequest, LeaveGroupResponse),
        _spec(2, 9, OffsetCommitRequest, OffsetCommitResponse),
        _spec(1, 9, OffsetFetchRequest, OffsetFetchResponse),
        _spec(0, 5, ListGroupsRequest, ListGroupsResponse),
        _spec(0, 5, DescribeGroupsRequest, DescribeGroupsResponse),
        _spec(0, 2, DeleteGroupsRequest, DeleteGroupsResponse),
        _spec(0, 1, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse),
        _spec(0, 0, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse),
        _spec(0, 0, OffsetDeleteRequest, OffsetDeleteResponse),
        _spec(0, 5, InitProducerIdRequest, InitProducerIdResponse),
        # Transactions of transaction version 1 (the transaction.version feature is not
        # advertised): the versions that mean version 2 (EndTxn v5, TxnOffsetCommit v5,
        # WriteTxnMarkers v2) are not served.
        _spec(0, 5, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse),
        _spec(0, 4, AddOffsetsToTxnRequest, AddOffsetsToTxnResponse),
        _spec(0, 4, EndTxnRequest, EndTxnResponse),
        _spec(0, 1, WriteTxnMarkersRequest, WriteTxnMarkersResponse),
        _spec(0, 4, TxnOffsetCommitRequest, TxnOffsetCommitResponse),
        _spec(0, 0, DescribeProducersRequest, DescribeProducersResponse),
        _spec(0, 0, DescribeTransactionsRequest, DescribeTransactionsResponse),
        _spec(0, 1, ListTransactionsRequest, ListTransactionsResponse),
        _spec(0, 3, DescribeAclsRequest, DescribeAclsResponse),
        _spec(0, 3, CreateAclsRequest, CreateAclsResponse),
        _spec(0, 3, DeleteAclsRequest, DeleteAclsResponse),
        _spec(0, 1, SaslHandshakeRequest, SaslHandshakeResponse),
        _spec(0, 2, SaslAuthenticateRequest, SaslAuthenticateResponse),
        _spec(0, 0, DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse),
        _spec(0, 0, AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse),
        _spec(0, 0, GetTelemetrySubscriptionsRequest, GetTelemetrySubscriptionsResponse),
        _spec(0, 0, PushTelemetryRequest, PushTelemetryResponse),
    )
}

# Keys the broker names outside this table (kafka-python's classes carry Kafka's numbers).
PRODUCE_KEY = ProduceRequestCodec.API_KEY
FETCH_KEY = FetchRequest.API_KEY
API_VERSIONS_KEY = ApiVersionsRequest.API_KEY
JOIN_GROUP_KEY = JoinGroupRequest.API_KEY
SYNC_GROUP_KEY = SyncGroupRequest.API_KEY
