"""Producer ids in cluster mode: blocks claimed by compare-and-swap on one etcd key.

Kafka's ZooKeeper-era ProducerIdManager: ``/latest_producer_id_block`` holds the last block
handed to any broker, ``{"version":1,"broker":N,"block_start":"s","block_end":"e"}`` (both ends
inclusive, as text). A broker claims the next block (start = the last end + 1, 1000 ids; the
first block starts at 0) with a txn that compares the key's version to the one it read (absent
for the first), and reads again and retries when another broker's claim won.

Invariant: an id is handed out only from a block this broker's txn wrote, so two brokers never
hand out the same id, and a restart never reuses one (it claims a new block). The next block is
claimed in the background once 90% of the current one is used (Kafka's prefetch), so
``generate`` (synchronous, on the request path) rarely finds none; when it does it answers
COORDINATOR_LOAD_IN_PROGRESS and the client retries.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import structlog

from broker.cluster.store import Compare, Get, MetadataStore, Put, StoreError
from broker.metadata.producer_ids import BLOCK_SIZE, ProducerIdManager
from protocol.errors import ErrorCode, KafkaError

logger = structlog.get_logger("broker.cluster")

LATEST_PRODUCER_ID_BLOCK = "/latest_producer_id_block"
LONG_MAX = (1 << 63) - 1
#: Claim the next block once this share of the current one is handed out.
PREFETCH_AT = 0.9


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    broker: int
    first: int
    last: int  # inclusive

    def encode(self) -> bytes:
        return json.dumps({"version": 1, "broker": self.broker, "block_start": str(self.first),
                           "block_end": str(self.last)}).encode()

    @classmethod
    def decode(cls, value: bytes) -> ProducerIdBlock:
        """ValueError for anything but Kafka's document."""
        try:
            doc = json.loads(value)
            block = cls(int(doc["broker"]), int(doc["block_start"]), int(doc["block_end"]))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"malformed producer id block: {value!r}") from e
        if not 0 <= block.first <= block.last:
            raise ValueError(f"malformed producer id block: {value!r}")
        return block


async def claim_block(store: MetadataStore, broker_id: int, *, attempts: int = 20
                      ) -> ProducerIdBlock:
    """The next block, written by compare-and-swap; StoreError when the store cannot be
    reached, or when other brokers won every attempt."""
    for _ in range(attempts):
        kv = await store.get(LATEST_PRODUCER_ID_BLOCK)
        if kv is None:
            first, compare = 0, Compare.absent(LATEST_PRODUCER_ID_BLOCK)
        else:
            first = ProducerIdBlock.decode(kv.value).last + 1
            compare = Compare.version(LATEST_PRODUCER_ID_BLOCK, "==", kv.version)
        if first > LONG_MAX - BLOCK_SIZE:
            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, "Exhausted all producerIds")
        block = ProducerIdBlock(broker_id, first, first + BLOCK_SIZE - 1)
        result = await store.txn([compare], [Put(LATEST_PRODUCER_ID_BLOCK, block.encode())],
                                 [Get(LATEST_PRODUCER_ID_BLOCK)])
        if result.succeeded:
            logger.info("producer id block claimed", first=block.first, last=block.last)
            return block
    raise StoreError(f"no producer id block claimed in {attempts} attempts")


class ClusterProducerIdManager(ProducerIdManager):
    """A broker's producer ids in cluster mode; ``start()`` claims the first block."""

    def __init__(self, store: MetadataStore, broker_id: int, *, retry_s: float = 0.2) -> None:
        self.store = store
        self.broker_id = broker_id
        self._retry_s = retry_s
        self._block: ProducerIdBlock | None = None
        self._next = 0
        self._prefetched: ProducerIdBlock | None = None
        self._claiming: asyncio.Task[None] | None = None
        self.blocks_claimed = 0

    async def start(self) -> None:
        self._use(await claim_block(self.store, self.broker_id))

    async def stop(self) -> None:
        task, self._claiming = self._claiming, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def generate(self) -> int:
        block = self._block
        if block is None or self._next > block.last:
            if self._prefetched is None:
                self._claim_next()
                raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                 "no producer id block at hand yet")
            block = self._use(self._prefetched)
            self._prefetched = None
        pid = self._next
        self._next += 1
        if self._next - block.first >= PREFETCH_AT * BLOCK_SIZE and self._prefetched is None:
            self._claim_next()
        return pid

    def _use(self, block: ProducerIdBlock) -> ProducerIdBlock:
        self._block = block
        self._next = block.first
        self.blocks_claimed += 1
        return block

    def _claim_next(self) -> None:
        if self._claiming is not None and not self._claiming.done():
            return
        self._claiming = asyncio.get_running_loop().create_task(self._prefetch(),
                                                                name="producer-id-block")

    async def _prefetch(self) -> None:
        while True:
            try:
                self._prefetched = await claim_block(self.store, self.broker_id)
                return
            except (StoreError, ValueError) as e:
                logger.warning("producer id block not claimed, retrying", error=str(e))
                await asyncio.sleep(self._retry_s)
