// Drives KafkaJS for tests/compat/test_kafkajs.py and test_kafkajs_txn.py: reads one JSON
// job on stdin, runs its steps in order against the brokers, and prints one JSON answer on
// stdout.
//
// Job:    {"brokers": ["host:port"], "steps": [{"op": ..., ...}, ...]}, optionally with
//         "ssl": {"ca": path, "cert": path, "key": path} and
//         "sasl": {"mechanism": "plain" | "scram-sha-256" | "scram-sha-512", "username", "password"}
// Answer: {"results": [one per step]} or {"error": "...", "step": n} with exit code 1.
// Keys, values and header values travel as base64 strings; null stays null.
'use strict'

const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require('kafkajs')

const CODECS = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD,
}

// KafkaJS ships only gzip; the other codecs are packages that register themselves. A
// codec whose package failed to install (they build native code) is reported, not fatal.
async function registerCodecs() {
  const missing = {}
  try {
    CompressionCodecs[CompressionTypes.Snappy] = require('kafkajs-snappy')
  } catch (e) {
    missing.snappy = `kafkajs-snappy: ${e.message.split('\n')[0]}`
  }
  try {
    const LZ4 = require('kafkajs-lz4')
    CompressionCodecs[CompressionTypes.LZ4] = new LZ4().codec
  } catch (e) {
    missing.lz4 = `kafkajs-lz4: ${e.message.split('\n')[0]}`
  }
  try {
    // Its CommonJS build is broken; the ES module registers the codec when imported.
    await import('@sensejs/kafkajs-zstd-support')
    if (!CompressionCodecs[CompressionTypes.ZSTD]) throw new Error('did not register')
  } catch (e) {
    missing.zstd = `@sensejs/kafkajs-zstd-support: ${e.message.split('\n')[0]}`
  }
  return missing
}

const b64 = buf => (buf == null ? null : Buffer.from(buf).toString('base64'))
const unb64 = s => (s == null ? null : Buffer.from(s, 'base64'))

// KafkaJS gives headers as an object; a repeated name comes back as an array.
function headerPairs(headers) {
  const out = []
  for (const [name, value] of Object.entries(headers || {})) {
    for (const v of Array.isArray(value) ? value : [value]) out.push([name, b64(v)])
  }
  return out
}

function toHeaders(pairs) {
  const out = {}
  for (const [name, value] of pairs || []) {
    if (name in out) throw new Error(`repeated header ${name} cannot be sent as an object`)
    out[name] = unb64(value)
  }
  return out
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

// Resolves when `promise` does or after `ms`, and clears its timer so that the process
// can exit as soon as the job is done.
function within(promise, ms) {
  let timer
  const expired = new Promise(resolve => (timer = setTimeout(resolve, ms)))
  return Promise.race([promise, expired]).finally(() => clearTimeout(timer))
}

async function createTopic(kafka, step) {
  const admin = kafka.admin()
  await admin.connect()
  try {
    const created = await admin.createTopics({
      waitForLeaders: true,
      topics: [{ topic: step.topic, numPartitions: step.partitions || 1, replicationFactor: 1 }],
    })
    const meta = await admin.fetchTopicMetadata({ topics: [step.topic] })
    return { created, partitions: meta.topics[0].partitions.map(p => p.partitionId).sort() }
  } finally {
    await admin.disconnect()
  }
}

// A record may name its partition; otherwise it goes to the step's (default 0).
function toMessages(step) {
  return step.records.map(r => ({
    key: unb64(r.key),
    value: unb64(r.value),
    headers: toHeaders(r.headers),
    partition: r.partition == null ? step.partition || 0 : r.partition,
    timestamp: r.timestamp == null ? undefined : String(r.timestamp),
  }))
}

const sendResult = meta =>
  meta.map(m => ({ partition: m.partition, errorCode: m.errorCode, baseOffset: Number(m.baseOffset) }))

async function produce(kafka, step) {
  const producer = kafka.producer({ allowAutoTopicCreation: false, idempotent: !!step.idempotent })
  await producer.connect()
  try {
    const meta = await producer.send({
      topic: step.topic,
      acks: -1,
      compression: CODECS[step.codec || 'none'],
      messages: toMessages(step),
    })
    return sendResult(meta)
  } finally {
    await producer.disconnect()
  }
}

// One transactional producer runs `transactions` in order, each {records, commit}: its
// records are sent (and acknowledged) before it commits or aborts.
async function transactions(kafka, step) {
  const producer = kafka.producer({
    allowAutoTopicCreation: false,
    transactionalId: step.transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
  })
  await producer.connect()
  try {
    const out = []
    for (const t of step.transactions) {
      const txn = await producer.transaction()
      const meta = await txn.send({ topic: step.topic, acks: -1, messages: toMessages(t) })
      await (t.commit ? txn.commit() : txn.abort())
      out.push(sendResult(meta))
    }
    return out
  } finally {
    await producer.disconnect()
  }
}

// A group member that records up to `limit` messages, returns once it has `count` (or
// at `timeoutMs`) plus `lingerMs` more to catch anything delivered twice, and commits
// exactly what it recorded when `commit` is set.
async function consume(kafka, step) {
  const consumer = kafka.consumer({
    groupId: step.groupId,
    sessionTimeout: 6000,
    rebalanceTimeout: 10000,
    heartbeatInterval: 500,
    maxWaitTimeInMs: 200,
    readUncommitted: !!step.readUncommitted,
  })
  const limit = step.limit == null ? Infinity : step.limit
  const got = []
  let reached
  const enough = new Promise(resolve => (reached = resolve))
  await consumer.connect()
  try {
    await consumer.subscribe({ topics: [step.topic], fromBeginning: step.fromBeginning !== false })
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        if (got.length >= limit) return
        got.push({
          partition,
          offset: Number(message.offset),
          timestamp: Number(message.timestamp),
          key: b64(message.key),
          value: b64(message.value),
          headers: headerPairs(message.headers),
        })
        if (got.length >= step.count) reached()
      },
    })
    for (const s of step.seek || []) {
      consumer.seek({ topic: step.topic, partition: s.partition, offset: String(s.offset) })
    }
    await within(enough, step.timeoutMs || 20000)
    await sleep(step.lingerMs || 0)
    if (step.commit) {
      const next = {}
      for (const m of got) next[m.partition] = Math.max(next[m.partition] || 0, m.offset + 1)
      await consumer.commitOffsets(Object.entries(next).map(([partition, offset]) => ({
        topic: step.topic, partition: Number(partition), offset: String(offset),
      })))
    }
    return got.slice(0, limit)
  } finally {
    await consumer.disconnect()
  }
}

async function offsets(kafka, step) {
  const admin = kafka.admin()
  await admin.connect()
  try {
    const out = { ends: await admin.fetchTopicOffsets(step.topic) }
    if (step.timestamp != null) {
      out.byTimestamp = await admin.fetchTopicOffsetsByTimestamp(step.topic, step.timestamp)
    }
    if (step.groupId) {
      out.committed = await admin.fetchOffsets({ groupId: step.groupId, topics: [step.topic] })
    }
    return out
  } finally {
    await admin.disconnect()
  }
}

const OPS = {
  codecs: async (_kafka, _step, missing) => ({ missing }),
  createTopic,
  produce,
  transactions,
  consume,
  offsets,
}

async function main() {
  const job = JSON.parse(require('fs').readFileSync(0, 'utf8'))
  const missing = await registerCodecs()
  const fs = require('fs')
  const ssl = job.ssl && {
    ca: [fs.readFileSync(job.ssl.ca, 'utf8')],
    cert: job.ssl.cert && fs.readFileSync(job.ssl.cert, 'utf8'),
    key: job.ssl.key && fs.readFileSync(job.ssl.key, 'utf8'),
  }
  const kafka = new Kafka({
    clientId: 'stratalog-compat',
    brokers: job.brokers,
    ssl,
    sasl: job.sasl,
    connectionTimeout: 5000,
    requestTimeout: 15000,
    retry: { retries: 3, initialRetryTime: 100 },
    logLevel: logLevel.WARN,
    // stdout carries the answer, so KafkaJS logs go to stderr
    logCreator: () => ({ namespace, level, log }) =>
      process.stderr.write(`[${namespace}] ${log.message} ${JSON.stringify(log)}\n`),
  })
  const results = []
  for (const [i, step] of job.steps.entries()) {
    const op = OPS[step.op]
    try {
      if (!op) throw new Error(`unknown op ${step.op}`)
      results.push(await op(kafka, step, missing))
    } catch (e) {
      process.stdout.write(JSON.stringify({ error: `${e.name}: ${e.message}`, step: i, results }) + '\n')
      process.exit(1)
    }
  }
  process.stdout.write(JSON.stringify({ results }) + '\n')
}

main().catch(e => {
  process.stdout.write(JSON.stringify({ error: `${e.name}: ${e.message}` }) + '\n')
  process.exit(1)
})
