// node-rdkafka (librdkafka underneath) against mini-broker: node conformance.js <bootstrap> <plan>
//
// <plan> is a JSON file written by tests/conformance/test_node_rdkafka.py naming the scenarios:
//   roundtrip  per codec: produce the given records to partition 0, read them back (assign)
//   read       read records another client produced (binary headers, null header values)
//   idempotent enable.idempotence over several partitions, then read everything back
//   resume     a group member processes the first half of each partition, committing each
//              record; a new member of the group resumes exactly after the committed offsets
//   groups     per assignor: two members share the partitions of a topic, committing what
//              they process
// Bytes travel as tokens: "-" is null, "=" + base64 is bytes (empty included).
// Prints one JSON summary line on stdout: what the client saw; it judges nothing, the pytest
// side does. librdkafka's own logs go to stderr. Exit 0 when every scenario reported (a
// scenario that threw reports {"error": ...}), 2 on a crash or the overall deadline.
'use strict'

const fs = require('fs')
const Kafka = require('node-rdkafka')

const [bootstrap, planPath] = process.argv.slice(2)
if (!bootstrap || !planPath) {
  process.stderr.write('usage: node conformance.js <bootstrap> <plan.json>\n')
  process.exit(64)
}
const plan = JSON.parse(fs.readFileSync(planPath, 'utf8'))
const DEADLINE_MS = Number(process.env.CONFORMANCE_TIMEOUT_MS || 100000)
const WAIT_MS = 30000 // any single wait

const BASE = {
  'metadata.broker.list': bootstrap,
  'broker.address.family': 'v4',
  'socket.timeout.ms': 10000,
  'client.id': 'mini-broker-node-rdkafka'
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const token = (b) => (b === null || b === undefined ? '-' : '=' + Buffer.from(b).toString('base64'))
const bytes = (t) => (t === '-' ? null : Buffer.from(t.slice(1), 'base64'))
// node-rdkafka passes an empty Buffer's data pointer to librdkafka, and for Buffer.alloc(0) that
// pointer is NULL: librdkafka then sends a null key or value. An empty view into a non-empty
// buffer has a real pointer, so an empty key or value stays empty.
const EMPTY = Buffer.alloc(1).subarray(0, 0)
const sendable = (t) => { const b = bytes(t); return b !== null && b.length === 0 ? EMPTY : b }

async function waitFor (what, predicate, timeoutMs = WAIT_MS) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await predicate()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(50)
  }
}

function promised (fn) {
  return new Promise((resolve, reject) => fn((err, value) => (err ? reject(err) : resolve(value))))
}

function errorText (e) {
  if (e && e.code !== undefined) return `${e.message} (code ${e.code})`
  return String(e && e.stack ? e.stack : e)
}

async function createTopics (topics) {
  const admin = Kafka.AdminClient.create({ ...BASE })
  try {
    for (const [topic, partitions] of topics) {
      await promised((cb) => admin.createTopic(
        { topic, num_partitions: partitions, replication_factor: 1 }, 15000, cb))
    }
  } finally {
    admin.disconnect()
  }
}

// -- producing ---------------------------------------------------------------------------------

class Producer {
  constructor (conf) {
    this.errors = []
    this.reports = new Map() // opaque -> {partition, offset} or {error}
    this.client = new Kafka.Producer({ ...BASE, dr_cb: true, ...conf })
    this.client.on('event.error', (e) => this.errors.push(errorText(e)))
    this.client.on('delivery-report', (err, report) => {
      this.reports.set(report.opaque, err
        ? { error: errorText(err) }
        : { partition: report.partition, offset: report.offset })
    })
    this.client.setPollInterval(20)
  }

  connect () { return promised((cb) => this.client.connect({}, cb)) }

  produce (topic, partition, value, key, timestamp, opaque, headers) {
    this.client.produce(topic, partition, value, key, timestamp, opaque, headers)
  }

  async settle (count) {
    await promised((cb) => this.client.flush(WAIT_MS, cb))
    await waitFor(`${count} delivery reports`, () => this.reports.size >= count)
  }

  disconnect () { return promised((cb) => this.client.disconnect(5000, cb)) }
}

// -- consuming ---------------------------------------------------------------------------------

// A consumer polled in the background (non-flowing consume of up to 100 messages at a time),
// so that rebalance callbacks are served while the scenario waits.
class Member {
  constructor (name, conf, topicConf, onMessage) {
    this.name = name
    this.errors = []
    this.rebalances = []
    this.onMessage = onMessage
    this.stopped = false
    this.client = new Kafka.KafkaConsumer({
      ...BASE,
      'enable.auto.commit': false,
      'fetch.wait.max.ms': 100,
      rebalance_cb: true,
      ...conf
    }, { 'auto.offset.reset': 'earliest', ...topicConf })
    this.client.on('event.error', (e) => this.errors.push(errorText(e)))
    this.client.on('rebalance', (err, assignment) => {
      this.rebalances.push([err.code, assignment.map((tp) => tp.partition).sort()])
    })
  }

  async start (attach) {
    await promised((cb) => this.client.connect({}, cb))
    this.client.setDefaultConsumeTimeout(100)
    attach(this.client)
    this.loop = this.poll()
  }

  async poll () {
    while (!this.stopped) {
      try {
        const messages = await promised((cb) => this.client.consume(100, cb))
        for (const m of messages) this.onMessage(this, m)
      } catch (e) {
        if (!this.stopped) this.errors.push(errorText(e))
        await sleep(50)
      }
    }
  }

  partitions () { return this.client.assignments().map((tp) => tp.partition).sort() }

  committed (topic, partitions) {
    return promised((cb) => this.client.committed(
      partitions.map((partition) => ({ topic, partition })), 10000, cb))
  }

  async stop () {
    this.stopped = true
    await this.loop
    await promised((cb) => this.client.disconnect(cb))
  }
}

function row (m) {
  const headers = (m.headers || []).map((h) => {
    const [k] = Object.keys(h)
    return [k, token(h[k])]
  })
  return [m.offset, m.timestamp, token(m.key), token(m.value), headers]
}

// Reads partitions [{topic, partition, offset}] until `count` records arrived.
async function readAssigned (toppars, count, group) {
  const rows = []
  const member = new Member('reader', { 'group.id': group }, {}, (_self, m) => rows.push([m.partition, row(m)]))
  await member.start((c) => c.assign(toppars))
  try {
    await waitFor(`${count} records read`, () => rows.length >= count || member.errors.length)
    await sleep(300) // anything more would be a duplicate
  } finally {
    await member.stop()
  }
  return { rows, errors: member.errors }
}

// -- scenarios ---------------------------------------------------------------------------------

async function roundtrip ({ codec, topic, records }) {
  await createTopics([[topic, 1]])
  const producer = new Producer({
    'compression.codec': codec, 'request.required.acks': -1, 'linger.ms': 20
  })
  await producer.connect()
  try {
    records.forEach(([ts, key, value, headers], i) => {
      const hs = headers.map(([k, v]) => ({ [bytes(k).toString('utf8')]: bytes(v).toString('utf8') }))
      producer.produce(topic, 0, sendable(value), sendable(key), ts, i, hs)
    })
    await producer.settle(records.length)
  } finally {
    await producer.disconnect()
  }
  const acked = records.map((_r, i) => producer.reports.get(i))
  const read = await readAssigned([{ topic, partition: 0, offset: 0 }], records.length, `${topic}-reader`)
  return { acked, records: read.rows.map(([_p, r]) => r), errors: [...producer.errors, ...read.errors] }
}

async function read ({ topic, count }) {
  const result = await readAssigned([{ topic, partition: 0, offset: 0 }], count, `${topic}-reader`)
  return { records: result.rows.map(([_p, r]) => r), errors: result.errors }
}

async function idempotent ({ topic, partitions, perPartition }) {
  await createTopics([[topic, partitions]])
  const producer = new Producer({
    'enable.idempotence': true,
    'max.in.flight.requests.per.connection': 5,
    'linger.ms': 5,
    'batch.num.messages': 25
  })
  await producer.connect()
  const sent = []
  try {
    for (let i = 0; i < perPartition; i++) {
      for (let p = 0; p < partitions; p++) {
        sent.push([p, `${p}:${i}`])
        producer.produce(topic, p, Buffer.from(`${p}:${i}`), null, null, sent.length - 1)
      }
    }
    await producer.settle(sent.length)
  } finally {
    await producer.disconnect()
  }
  const acked = sent.map(([p, v], i) => {
    const r = producer.reports.get(i)
    return r.error ? [p, null, v, r.error] : [r.partition, r.offset, v]
  })
  const toppars = [...Array(partitions).keys()].map((partition) => ({ topic, partition, offset: 0 }))
  const result = await readAssigned(toppars, sent.length, `${topic}-reader`)
  const consumed = result.rows.map(([p, r]) => [p, r[0], bytes(r[3]).toString()])
  return { acked, consumed, errors: [...producer.errors, ...result.errors] }
}

async function produceNumbered (topic, partitions, perPartition) {
  const producer = new Producer({ 'request.required.acks': -1, 'linger.ms': 5 })
  await producer.connect()
  try {
    let n = 0
    for (let p = 0; p < partitions; p++) {
      for (let i = 0; i < perPartition; i++) {
        producer.produce(topic, p, Buffer.from(`${p}:${i}`), Buffer.from(`k${i}`), null, n++)
      }
    }
    await producer.settle(n)
    const failed = [...producer.reports.values()].filter((r) => r.error)
    if (failed.length) throw new Error(`produce failed: ${JSON.stringify(failed.slice(0, 5))}`)
  } finally {
    await producer.disconnect()
  }
}

function groupMember (name, group, rows, commitErrors, wanted, conf = {}, topicConf = {}) {
  return new Member(name, {
    'group.id': group, 'session.timeout.ms': 6000, 'heartbeat.interval.ms': 250, ...conf
  }, topicConf, (self, m) => {
    if (!wanted(m)) return
    rows.push([self.name, m.partition, m.offset, m.value.toString()])
    try {
      self.client.commitMessageSync(m)
    } catch (e) {
      commitErrors.push([self.name, m.partition, m.offset, errorText(e)])
    }
  })
}

function byPartition (committed) {
  return Object.fromEntries(committed.map((tp) => [tp.partition, tp.offset]))
}

async function resume ({ topic, group, partitions, perPartition }) {
  await createTopics([[topic, partitions]])
  await produceNumbered(topic, partitions, perPartition)
  const half = perPartition / 2
  const all = [...Array(partitions).keys()]
  const rows = []
  const commitErrors = []

  // The first member processes offsets below `half` of every partition, committing each.
  const first = groupMember('first', group, rows, commitErrors, (m) => m.offset < half)
  await first.start((c) => c.subscribe([topic]))
  let committedByFirst
  try {
    await waitFor('the first half processed',
      () => rows.length >= half * partitions || first.errors.length)
    await sleep(300)
    committedByFirst = byPartition(await first.committed(topic, all))
  } finally {
    await first.stop()
  }

  // auto.offset.reset=error: without a committed offset the new member would fail, not rewind.
  const second = groupMember('second', group, rows, commitErrors, () => true, {},
    { 'auto.offset.reset': 'error' })
  await second.start((c) => c.subscribe([topic]))
  let committedAtEnd
  try {
    await waitFor('every record processed',
      () => rows.length >= perPartition * partitions || second.errors.length)
    await sleep(500) // anything more would be a duplicate
    committedAtEnd = byPartition(await second.committed(topic, all))
  } finally {
    await second.stop()
  }
  return {
    rows,
    commitErrors,
    committedByFirst,
    committedAtEnd,
    errors: { first: first.errors, second: second.errors },
    rebalances: { first: first.rebalances, second: second.rebalances }
  }
}

// Members join one after another; each join waits until the group has split the partitions
// among everyone so far, so the second join is a real rebalance (eager for range, incremental
// for cooperative-sticky). Then records are produced and processed.
async function sharedGroup ({ topic, group, partitions, perPartition, members: count, assignor }) {
  await createTopics([[topic, partitions]])
  const rows = []
  const commitErrors = []
  const members = [...Array(count).keys()].map((i) =>
    groupMember(`member-${i}`, group, rows, commitErrors, () => true,
      { 'partition.assignment.strategy': assignor }))
  const split = (started) => waitFor(`the partitions split among ${started.length}`, () => {
    const parts = started.map((m) => m.partitions())
    const flat = parts.flat().sort((a, b) => a - b)
    const whole = flat.length === partitions && flat.every((p, i) => p === i)
    return whole && parts.every((ps) => ps.length > 0) ? parts : null
  })
  const assignments = []
  try {
    for (let i = 0; i < count; i++) {
      await members[i].start((c) => c.subscribe([topic]))
      assignments.push(await split(members.slice(0, i + 1)))
    }
    await produceNumbered(topic, partitions, perPartition)
    await waitFor('every record processed', () => rows.length >= partitions * perPartition)
    await sleep(500) // anything more would be a duplicate
    const committed = byPartition(
      await members[0].committed(topic, [...Array(partitions).keys()]))
    return {
      assignments,
      finalAssignment: members.map((m) => m.partitions()),
      protocol: members.map((m) => m.client.rebalanceProtocol()),
      rows,
      commitErrors,
      committed,
      errors: Object.fromEntries(members.map((m) => [m.name, m.errors])),
      rebalances: Object.fromEntries(members.map((m) => [m.name, m.rebalances]))
    }
  } finally {
    for (const m of members) if (m.loop) await m.stop()
  }
}

// -- main --------------------------------------------------------------------------------------

async function scenario (results, name, fn, spec) {
  const started = Date.now()
  try {
    results[name] = await fn(spec)
  } catch (e) {
    results[name] = { error: errorText(e) }
  }
  results[name].ms = Date.now() - started
}

async function main () {
  const results = {}
  for (const spec of plan.roundtrip || []) {
    await scenario(results, `roundtrip:${spec.codec}`, roundtrip, spec)
  }
  if (plan.read) await scenario(results, 'read', read, plan.read)
  if (plan.idempotent) await scenario(results, 'idempotent', idempotent, plan.idempotent)
  if (plan.resume) await scenario(results, 'resume', resume, plan.resume)
  for (const spec of plan.groups || []) {
    await scenario(results, `group:${spec.assignor}`, sharedGroup, spec)
  }
  return {
    client: 'node-rdkafka',
    version: require('node-rdkafka/package.json').version,
    librdkafka: Kafka.librdkafkaVersion,
    features: Kafka.features,
    results
  }
}

const timer = setTimeout(() => {
  process.stderr.write(`conformance: no result after ${DEADLINE_MS} ms\n`)
  process.exit(2)
}, DEADLINE_MS)

main().then((summary) => {
  clearTimeout(timer)
  // process.exit only once the line is out: writes to a pipe are asynchronous
  process.stdout.write(JSON.stringify(summary) + '\n', () => process.exit(0))
}, (err) => {
  process.stderr.write(`conformance failed: ${errorText(err)}\n`)
  process.exit(2)
})
