// node-rdkafka over an authenticated listener: node secure.js <config.json> <topic> <group>
//
// <config.json> holds librdkafka's keys for the listener (bootstrap.servers, security.protocol,
// sasl.mechanism, sasl.username, sasl.password, ssl.ca.location ...), as the pytest side builds
// them for every librdkafka client. The records come on stdin as JSON [[key, value], ...] of
// strings. Produces them all (acks=all), then reads them in a group that commits each record
// it processes, and prints one JSON line on stdout: {got: [[key, value], ...], errors: [...]}.
// It judges nothing; the pytest side does. Exit 0 when it reported, 2 on a crash or the deadline.
'use strict'

const fs = require('fs')
const Kafka = require('node-rdkafka')

const [configPath, topic, group] = process.argv.slice(2)
if (!configPath || !topic || !group) {
  process.stderr.write('usage: node secure.js <config.json> <topic> <group> < records.json\n')
  process.exit(64)
}
const conf = JSON.parse(fs.readFileSync(configPath, 'utf8'))
const records = JSON.parse(fs.readFileSync(0, 'utf8'))
const WAIT_MS = 30000
const DEADLINE_MS = Number(process.env.SECURE_TIMEOUT_MS || 50000)

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const promised = (fn) => new Promise((resolve, reject) =>
  fn((err, value) => (err ? reject(err) : resolve(value))))
const errorText = (e) => (e && e.code !== undefined ? `${e.message} (code ${e.code})` : String(e))

async function produce (errors) {
  const producer = new Kafka.Producer({ ...conf, dr_cb: true, 'request.required.acks': -1, 'linger.ms': 5 })
  let reported = 0
  producer.on('event.error', (e) => errors.push(`producer: ${errorText(e)}`))
  producer.on('delivery-report', (err) => {
    reported++
    if (err) errors.push(`delivery: ${errorText(err)}`)
  })
  producer.setPollInterval(20)
  await promised((cb) => producer.connect({}, cb))
  try {
    for (const [key, value] of records) {
      producer.produce(topic, null, Buffer.from(value), Buffer.from(key))
    }
    await promised((cb) => producer.flush(WAIT_MS, cb))
    const deadline = Date.now() + WAIT_MS
    while (reported < records.length && Date.now() < deadline) await sleep(20)
  } finally {
    await promised((cb) => producer.disconnect(5000, cb))
  }
}

async function consume (errors) {
  const consumer = new Kafka.KafkaConsumer({
    ...conf,
    'group.id': group,
    'enable.auto.commit': false,
    'fetch.wait.max.ms': 100
  }, { 'auto.offset.reset': 'earliest' })
  consumer.on('event.error', (e) => errors.push(`consumer: ${errorText(e)}`))
  await promised((cb) => consumer.connect({}, cb))
  consumer.setDefaultConsumeTimeout(100)
  const got = []
  try {
    consumer.subscribe([topic])
    const deadline = Date.now() + WAIT_MS
    while (got.length < records.length && Date.now() < deadline) {
      const messages = await promised((cb) => consumer.consume(100, cb))
      for (const m of messages) {
        got.push([m.key.toString(), m.value.toString()])
        consumer.commitMessageSync(m)
      }
    }
  } finally {
    await promised((cb) => consumer.disconnect(cb))
  }
  return got
}

async function main () {
  const errors = []
  await produce(errors)
  const got = await consume(errors)
  process.stdout.write(JSON.stringify({ got, errors }) + '\n')
}

const timer = setTimeout(() => {
  process.stderr.write(`secure: no result after ${DEADLINE_MS} ms\n`)
  process.exit(2)
}, DEADLINE_MS)

main().then(() => {
  clearTimeout(timer)
  process.exit(0)
}, (err) => {
  process.stderr.write(`secure failed: ${err && err.stack ? err.stack : err}\n`)
  process.exit(2)
})
