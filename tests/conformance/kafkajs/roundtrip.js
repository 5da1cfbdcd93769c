// kafkajs against mini-broker: node roundtrip.js <bootstrap> <topic> <n>
//
// Creates <topic> (3 partitions), starts a consumer group of two members and waits until the
// group is stable, produces <n> messages with the idempotent producer, reads them all through
// the group (each message committed right after it is processed), then prints one JSON summary
// on stdout. kafkajs' own logs go to stderr. Exit code 0 when the run completed (the summary
// says what happened; the pytest side judges it), 2 on error or timeout.
'use strict'

const { Kafka, logLevel, Partitioners } = require('kafkajs')

const [bootstrap, topic, nArg] = process.argv.slice(2)
const n = Number(nArg)
if (!bootstrap || !topic || !Number.isInteger(n) || n <= 0) {
  process.stderr.write('usage: node roundtrip.js <bootstrap> <topic> <n>\n')
  process.exit(64)
}
const groupId = `${topic}-group`
const PARTITIONS = 3
const MEMBERS = 2
const DEADLINE_MS = Number(process.env.ROUNDTRIP_TIMEOUT_MS || 60000)

const kafka = new Kafka({
  clientId: 'mini-broker-conformance',
  brokers: [bootstrap],
  connectionTimeout: 5000,
  requestTimeout: 15000,
  retry: { retries: 5, initialRetryTime: 100 },
  logLevel: logLevel.WARN,
  logCreator: () => ({ namespace, level, label, log }) => {
    process.stderr.write(`[${label}] ${namespace}: ${JSON.stringify(log)}\n`)
  }
})

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function waitFor (what, predicate, timeoutMs) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await predicate()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(100)
  }
}

async function main () {
  const admin = kafka.admin()
  const producer = kafka.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    createPartitioner: Partitioners.DefaultPartitioner
  })
  const consumers = []
  const received = [] // {member, partition, offset, value}
  const commitErrors = []
  try {
    await admin.connect()
    await admin.createTopics({ topics: [{ topic, numPartitions: PARTITIONS }], waitForLeaders: true })

    for (let i = 0; i < MEMBERS; i++) {
      const member = `member-${i}`
      const consumer = kafka.consumer({
        groupId,
        sessionTimeout: 6000,
        heartbeatInterval: 250,
        maxWaitTimeInMs: 100,
        rebalanceTimeout: 10000
      })
      await consumer.connect()
      await consumer.subscribe({ topics: [topic], fromBeginning: true })
      await consumer.run({
        autoCommit: false,
        eachMessage: async ({ partition, message }) => {
          received.push({ member, partition, offset: Number(message.offset), value: message.value.toString() })
          const next = (BigInt(message.offset) + 1n).toString()
          try {
            await consumer.commitOffsets([{ topic, partition, offset: next }])
          } catch (e) {
            commitErrors.push({ member, partition, offset: message.offset, error: String(e) })
          }
        }
      })
      consumers.push(consumer)
    }

    const stable = await waitFor('a stable group of two', async () => {
      const { groups: [g] } = await admin.describeGroups([groupId])
      return g.state === 'Stable' && g.members.length === MEMBERS ? g : null
    }, 30000)

    await producer.connect()
    const produced = []
    const batch = 50
    for (let start = 0; start < n; start += batch) {
      const messages = []
      for (let i = start; i < Math.min(n, start + batch); i++) {
        messages.push({ key: `key-${i}`, value: `value-${i}` })
      }
      const meta = await producer.send({ topic, acks: -1, messages })
      for (const m of meta) {
        if (m.errorCode !== 0) throw new Error(`produce error ${JSON.stringify(m)}`)
      }
      produced.push(...messages.map((m) => m.value))
    }

    await waitFor(`${n} messages consumed`, () => received.length >= n, 30000)
    await sleep(500) // anything arriving now would be a duplicate

    const fetched = await admin.fetchOffsets({ groupId, topics: [topic] })
    const committed = {}
    for (const p of fetched[0].partitions) committed[p.partition] = Number(p.offset)
    const highWatermarks = {}
    for (const p of await admin.fetchTopicOffsets(topic)) highWatermarks[p.partition] = Number(p.high)

    const counts = {}
    for (const r of received) counts[r.value] = (counts[r.value] || 0) + 1
    const perMember = {}
    for (const r of received) perMember[r.member] = (perMember[r.member] || 0) + 1
    const summary = {
      kafkajs: require('kafkajs/package.json').version,
      topic,
      groupId,
      produced: produced.length,
      consumed: received.length,
      unique: Object.keys(counts).length,
      duplicates: Object.values(counts).filter((c) => c > 1).length,
      missing: produced.filter((v) => !(v in counts)).length,
      perMember,
      membersWhenStable: stable.members.length,
      protocol: stable.protocol,
      committed,
      highWatermarks,
      commitErrors
    }
    await Promise.all(consumers.map((c) => c.disconnect()))
    consumers.length = 0
    const { groups: [after] } = await admin.describeGroups([groupId])
    summary.groupStateAfterDisconnect = after.state
    process.stdout.write(JSON.stringify(summary) + '\n')
  } finally {
    await Promise.allSettled([producer.disconnect(), admin.disconnect(),
      ...consumers.map((c) => c.disconnect())])
  }
}

const timer = setTimeout(() => {
  process.stderr.write(`roundtrip: no result after ${DEADLINE_MS} ms\n`)
  process.exit(2)
}, DEADLINE_MS)

main().then(() => {
  clearTimeout(timer)
  process.exit(0)
}, (err) => {
  process.stderr.write(`roundtrip failed: ${err && err.stack ? err.stack : err}\n`)
  process.exit(2)
})
