// kafkajs transactions against mini-broker: node transactions.js <bootstrap> <prefix>
//
// 1. On <prefix>-txn (one partition), one transactional producer: a committed transaction
//    ("first-0..4"), an aborted one ("aborted-0..4", sent and acknowledged before the abort)
//    and a committed one ("last-0..4"). A read_committed consumer group and a read_uncommitted
//    one (readUncommitted: true) read the topic from the beginning until "last-4".
// 2. Consume-transform-produce with sendOffsets: a read_committed group reads five plain
//    records of <prefix>-in; a transaction writes them upper-cased to <prefix>-out and sends
//    the group's offset (5); the group's committed offset (Admin fetchOffsets) is recorded
//    before and after the commit. A second round (three more records, offset 8) is aborted,
//    and the offset recorded again. Last, a read_committed group reads <prefix>-out to "END".
// 3. Fencing: a producer opens a transaction on <prefix>-fenced and sends three records; a
//    second producer with the same transactionalId begins one (its InitProducerId fences the
//    first and aborts its transaction); the first one's commit must fail; the second commits
//    its own records, and a read_committed group reads only those.
// Prints one JSON summary on stdout (the pytest side judges it); kafkajs logs go to stderr.
// Exit code 0 when the run completed, 2 on error or timeout.
'use strict'

const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, prefix] = process.argv.slice(2)
if (!bootstrap || !prefix) {
  process.stderr.write('usage: node transactions.js <bootstrap> <prefix>\n')
  process.exit(64)
}
const DEADLINE_MS = Number(process.env.TRANSACTIONS_TIMEOUT_MS || 90000)
const WAIT_MS = 20000

const kafka = new Kafka({
  clientId: 'mini-broker-conformance-txn',
  brokers: [bootstrap],
  connectionTimeout: 5000,
  requestTimeout: 15000,
  retry: { retries: 5, initialRetryTime: 100 },
  logLevel: logLevel.WARN,
  logCreator: () => ({ namespace, label, log }) => {
    process.stderr.write(`[${label}] ${namespace}: ${JSON.stringify(log)}\n`)
  }
})

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function waitFor (what, predicate, timeoutMs = WAIT_MS) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await predicate()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(100)
  }
}

const values = (prefix, n) => Array.from({ length: n }, (_, i) => ({ value: `${prefix}-${i}` }))

/** Every [offset, value] a fresh group reads of `topic` from the beginning, up to `last`. */
async function readTopic (topic, readUncommitted, last, open) {
  const consumer = kafka.consumer({
    groupId: `${topic}-read-${readUncommitted ? 'uncommitted' : 'committed'}`,
    readUncommitted,
    maxWaitTimeInMs: 100,
    sessionTimeout: 6000,
    heartbeatInterval: 300
  })
  open.push(consumer)
  const got = []
  await consumer.connect()
  await consumer.subscribe({ topics: [topic], fromBeginning: true })
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ message }) => {
      got.push([Number(message.offset), message.value.toString()])
    }
  })
  await waitFor(`${last} in ${topic}`, () => got.some(([, v]) => v === last))
  await consumer.disconnect()
  return got
}

async function groupOffset (admin, groupId, topic) {
  const [t] = await admin.fetchOffsets({ groupId, topics: [topic] })
  return Object.fromEntries(t.partitions.map((p) => [p.partition, Number(p.offset)]))
}

async function main () {
  const admin = kafka.admin()
  const open = []
  const summary = { kafkajs: require('kafkajs/package.json').version }
  const txnTopic = `${prefix}-txn`
  const input = `${prefix}-in`
  const output = `${prefix}-out`
  const group = `${prefix}-ctp`
  const fencedTopic = `${prefix}-fenced`
  try {
    await admin.connect()
    await admin.createTopics({
      topics: [txnTopic, input, output, fencedTopic].map((topic) => ({ topic, numPartitions: 1 })),
      waitForLeaders: true
    })

    // 1. commit, abort, commit
    const producer = kafka.producer({
      transactionalId: `${prefix}-producer`,
      maxInFlightRequests: 1,
      idempotent: true,
      transactionTimeout: 10000
    })
    open.push(producer)
    await producer.connect()
    for (const [name, end] of [['first', 'commit'], ['aborted', 'abort'], ['last', 'commit']]) {
      const txn = await producer.transaction()
      await txn.send({ topic: txnTopic, acks: -1, messages: values(name, 5) })
      await txn[end]()
    }
    summary.readCommitted = await readTopic(txnTopic, false, 'last-4', open)
    summary.readUncommitted = await readTopic(txnTopic, true, 'last-4', open)
    const [end] = await admin.fetchTopicOffsets(txnTopic)
    summary.highWatermark = Number(end.high)

    // 2. consume-transform-produce with sendOffsets
    const plain = kafka.producer({ idempotent: true, maxInFlightRequests: 1 })
    open.push(plain)
    await plain.connect()
    await plain.send({ topic: input, acks: -1, messages: values('in', 5) })
    const consumer = kafka.consumer({
      groupId: group,
      maxWaitTimeInMs: 100,
      sessionTimeout: 6000,
      heartbeatInterval: 300
    })
    open.push(consumer)
    const consumed = []
    await consumer.connect()
    await consumer.subscribe({ topics: [input], fromBeginning: true })
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ message }) => {
        consumed.push({ offset: Number(message.offset), value: message.value.toString() })
      }
    })
    const offsets = {}
    summary.offsets = offsets
    for (const [round, want, end] of [['commit', 5, 'commit'], ['abort', 8, 'abort']]) {
      if (round === 'abort') {
        await plain.send({ topic: input, acks: -1, messages: values('more', 3) })
      }
      await waitFor(`${want} input records`, () => consumed.length >= want)
      offsets[`${round}Consumed`] = consumed.length
      const txn = await producer.transaction()
      const batch = consumed.slice(round === 'commit' ? 0 : 5)
      await txn.send({
        topic: output,
        acks: -1,
        messages: batch.map((r) => ({ value: r.value.toUpperCase() }))
      })
      const next = String(batch[batch.length - 1].offset + 1)
      await txn.sendOffsets({
        consumerGroupId: group,
        topics: [{ topic: input, partitions: [{ partition: 0, offset: next }] }]
      })
      offsets[`${round}Before`] = await groupOffset(admin, group, input)
      await txn[end]()
      if (end === 'commit') {
        await waitFor('the committed offset', async () =>
          (await groupOffset(admin, group, input))[0] === Number(next))
      }
      offsets[`${round}After`] = await groupOffset(admin, group, input)
    }
    await consumer.disconnect()
    const txn = await producer.transaction()
    await txn.send({ topic: output, acks: -1, messages: [{ value: 'END' }] })
    await txn.commit()
    summary.output = await readTopic(output, false, 'END', open)

    // 3. fencing of a zombie
    const fencedConfig = {
      transactionalId: `${prefix}-fenced-producer`,
      maxInFlightRequests: 1,
      idempotent: true,
      transactionTimeout: 10000
    }
    const zombie = kafka.producer(fencedConfig)
    open.push(zombie)
    await zombie.connect()
    const zombieTxn = await zombie.transaction()
    await zombieTxn.send({ topic: fencedTopic, acks: -1, messages: values('zombie', 3) })
    const successor = kafka.producer(fencedConfig)
    open.push(successor)
    await successor.connect()
    // kafkajs sends the transactional InitProducerId with the first transaction()
    const successorTxn = await successor.transaction()
    try {
      await zombieTxn.commit()
      summary.zombieCommit = { committed: true }
    } catch (e) {
      const cause = e.originalError || e
      summary.zombieCommit = { committed: false, name: e.name, type: cause.type || null }
    }
    await successorTxn.send({ topic: fencedTopic, acks: -1, messages: values('successor', 3) })
    await successorTxn.commit()
    summary.fencedRead = await readTopic(fencedTopic, false, 'successor-2', open)
    process.stdout.write(JSON.stringify(summary) + '\n')
  } finally {
    await Promise.allSettled([admin.disconnect(), ...open.map((c) => c.disconnect())])
  }
}

const timer = setTimeout(() => {
  process.stderr.write(`transactions: no result after ${DEADLINE_MS} ms\n`)
  process.exit(2)
}, DEADLINE_MS)

main().then(() => {
  clearTimeout(timer)
  process.exit(0)
}, (err) => {
  process.stderr.write(`transactions failed: ${err && err.stack ? err.stack : err}\n`)
  process.exit(2)
})
