"""Why a connection is not being read: flags, each set and cleared by the one owner of its
reason; a connection reads again only when every flag is clear."""

from enum import IntFlag


class MuteReason(IntFlag):
    MEMORY = 1  # over its share of queued.max.request.bytes
    INFLIGHT = 2  # this connection has too many requests in flight
    SERIAL = 4  # serial mode: one request at a time, as Kafka's processor does
    SHUTDOWN = 8  # the broker is draining: no new requests
    WRITE = 16  # the client is not reading: its transport's buffer passed the high-water mark
    BACKLOG = 32  # requests of this connection already wait for a handler turn
    SASL = 64  # (re-)authenticating: one request at a time, each answered before the next
