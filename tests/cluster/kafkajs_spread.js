// kafkajs against a cluster: node kafkajs_spread.js <bootstrap,...> <topic> <partitions> <n>
//
// Produces <n> records to each partition of <topic> (an existing topic whose partitions are led
// by different brokers), acks=-1, one send per partition; then reads every partition from the
// beginning in a consumer group of one member (kafkajs has no assign()), and prints one JSON
// line on stdout: {acked: [[partition, baseOffset, count]], consumed: [[partition, offset, key,
// value]]}. kafkajs is resolved through NODE_PATH (tests/conformance/kafkajs/node_modules).
// Exit 0 when the run completed (the pytest side judges it), 2 on error or timeout.
'use strict'

const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, topic, partitionsArg, nArg] = process.argv.slice(2)
const partitions = Number(partitionsArg)
const n = Number(nArg)
if (!bootstrap || !topic || !Number.isInteger(partitions) || !Number.isInteger(n)) {
  process.stderr.write('usage: node kafkajs_spread.js <bootstrap,...> <topic> <partitions> <n>\n')
  process.exit(64)
}
const DEADLINE_MS = Number(process.env.SPREAD_TIMEOUT_MS || 60000)

const kafka = new Kafka({
  clientId: 'mini-broker-cluster',
  brokers: bootstrap.split(','),
  connectionTimeout: 5000,
  requestTimeout: 15000,
  retry: { retries: 8, initialRetryTime: 100 },
  logLevel: logLevel.WARN,
  logCreator: () => ({ namespace, label, log }) => {
    process.stderr.write(`[${label}] ${namespace}: ${JSON.stringify(log)}\n`)
  }
})

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function main () {
  const producer = kafka.producer({ allowAutoTopicCreation: false })
  const consumer = kafka.consumer({
    groupId: `${topic}-g`, sessionTimeout: 6000, heartbeatInterval: 250, maxWaitTimeInMs: 100
  })
  const acked = []
  const consumed = []
  try {
    await producer.connect()
    for (let p = 0; p < partitions; p++) {
      const messages = []
      for (let i = 0; i < n; i++) {
        messages.push({ partition: p, key: `k${p}-${i}`, value: `kafkajs:${p}:${i}` })
      }
      for (const m of await producer.send({ topic, acks: -1, messages })) {
        acked.push([m.partition, Number(m.baseOffset), m.errorCode])
      }
    }
    await consumer.connect()
    await consumer.subscribe({ topics: [topic], fromBeginning: true })
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        consumed.push([partition, Number(message.offset), message.key.toString(),
          message.value.toString()])
      }
    })
    const deadline = Date.now() + DEADLINE_MS - 5000
    while (consumed.length < partitions * n && Date.now() < deadline) await sleep(100)
    await sleep(300) // anything arriving now would be a duplicate
    process.stdout.write(JSON.stringify({ acked, consumed }) + '\n')
  } finally {
    await Promise.allSettled([producer.disconnect(), consumer.disconnect()])
  }
}

const timer = setTimeout(() => {
  process.stderr.write(`kafkajs_spread: no result after ${DEADLINE_MS} ms\n`)
  process.exit(2)
}, DEADLINE_MS)

main().then(() => {
  clearTimeout(timer)
  process.exit(0)
}, (err) => {
  process.stderr.write(`kafkajs_spread failed: ${err && err.stack ? err.stack : err}\n`)
  process.exit(2)
})
