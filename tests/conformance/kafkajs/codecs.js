// kafkajs' built-in codecs against mini-broker: node codecs.js <bootstrap> <topic> <codec>
//
// Reads the records to send as JSON on stdin: [{key, value, headers, timestamp}], where key and
// value are hex strings or null, headers a list of [name, {str}|{hex}] (kafkajs takes a header
// value as a string or a Buffer) and timestamp the CreateTime in ms. Produces them to partition
// 0 of <topic> (which must exist) with <codec> ("none" or "gzip": the codecs kafkajs ships
// without third-party packages) in two sends, hence two batches; then reads them back through a
// consumer group of one and prints one JSON summary on stdout, with every record as consumed
// (key, value and header values in hex, headers in the order kafkajs returns them). kafkajs' own
// logs go to stderr. Exit code 0 when the run completed (pytest judges the summary), 2 on error
// or timeout.
'use strict'

const { Kafka, logLevel, CompressionTypes } = require('kafkajs')

const [bootstrap, topic, codec] = process.argv.slice(2)
const CODECS = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP }
if (!bootstrap || !topic || !(codec in CODECS)) {
  process.stderr.write('usage: node codecs.js <bootstrap> <topic> none|gzip < records.json\n')
  process.exit(64)
}
const DEADLINE_MS = Number(process.env.CODECS_TIMEOUT_MS || 45000)

const kafka = new Kafka({
  clientId: 'mini-broker-codecs',
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
const fromHex = (h) => (h === null ? null : Buffer.from(h, 'hex'))
const toHex = (b) => (b === null || b === undefined ? null : Buffer.from(b).toString('hex'))

function readStdin () {
  return new Promise((resolve, reject) => {
    const chunks = []
    process.stdin.on('data', (c) => chunks.push(c))
    process.stdin.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')))
    process.stdin.on('error', reject)
  })
}

function toMessage (r) {
  const headers = {}
  for (const [name, v] of r.headers) {
    const value = 'str' in v ? v.str : fromHex(v.hex)
    if (headers[name] === undefined) headers[name] = value
    else headers[name] = [].concat(headers[name], [value])
  }
  return {
    partition: 0,
    key: fromHex(r.key),
    value: fromHex(r.value),
    headers,
    timestamp: String(r.timestamp)
  }
}

// kafkajs hands headers back as an object, a repeated name as an array of its values in order.
function flatHeaders (headers) {
  const out = []
  for (const [name, v] of Object.entries(headers || {})) {
    for (const one of Array.isArray(v) ? v : [v]) out.push([name, toHex(one)])
  }
  return out
}

async function main () {
  const records = JSON.parse(await readStdin())
  const producer = kafka.producer({ allowAutoTopicCreation: false })
  const consumer = kafka.consumer({
    groupId: `${topic}-codecs`,
    sessionTimeout: 6000,
    heartbeatInterval: 250,
    maxWaitTimeInMs: 100
  })
  const consumed = []
  try {
    await producer.connect()
    const half = Math.ceil(records.length / 2)
    const offsets = []
    for (const part of [records.slice(0, half), records.slice(half)]) {
      const meta = await producer.send({
        topic,
        acks: -1,
        compression: CODECS[codec],
        messages: part.map(toMessage)
      })
      for (const m of meta) {
        if (m.errorCode !== 0) throw new Error(`produce error ${JSON.stringify(m)}`)
        offsets.push(Number(m.baseOffset))
      }
    }

    await consumer.connect()
    await consumer.subscribe({ topics: [topic], fromBeginning: true })
    await consumer.run({
      eachMessage: async ({ partition, message }) => {
        consumed.push({
          partition,
          offset: Number(message.offset),
          key: toHex(message.key),
          value: toHex(message.value),
          headers: flatHeaders(message.headers),
          timestamp: Number(message.timestamp)
        })
      }
    })
    const deadline = Date.now() + 30000
    while (consumed.length < records.length && Date.now() < deadline) await sleep(100)
    await sleep(300) // anything arriving now would be a duplicate
    process.stdout.write(JSON.stringify({
      kafkajs: require('kafkajs/package.json').version,
      codec,
      baseOffsets: offsets,
      consumed
    }) + '\n')
  } finally {
    await Promise.allSettled([producer.disconnect(), consumer.disconnect()])
  }
}

const timer = setTimeout(() => {
  process.stderr.write(`codecs: no result after ${DEADLINE_MS} ms\n`)
  process.exit(2)
}, DEADLINE_MS)

main().then(() => {
  clearTimeout(timer)
  process.exit(0)
}, (err) => {
  process.stderr.write(`codecs failed: ${err && err.stack ? err.stack : err}\n`)
  process.exit(2)
})
