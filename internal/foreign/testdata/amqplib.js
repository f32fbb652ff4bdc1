// A foreign AMQP client for internal/foreign's tests, on Node's amqplib.
//
//   node amqplib.js publish URL QUEUE JSON  publishes one message to QUEUE through the default
//                                           exchange on a confirm channel: JSON is
//                                           {"body": "...", "properties": {...}} with amqplib's
//                                           publish options (contentType, timestamp, ...)
//   node amqplib.js get URL QUEUE TIMEOUT_MS  takes one message from QUEUE (waiting up to
//                                           TIMEOUT_MS) and prints {"body", "properties"} as
//                                           JSON, as amqplib reads them
'use strict';
const amqp = require('amqplib');

async function main() {
  const [mode, url, queue, arg] = process.argv.slice(2);
  const conn = await amqp.connect(url);
  try {
    if (mode === 'publish') {
      const spec = JSON.parse(arg);
      const ch = await conn.createConfirmChannel();
      await new Promise((resolve, reject) => {
        ch.publish('', queue, Buffer.from(spec.body), spec.properties, (err) => (err ? reject(err) : resolve()));
      });
      await ch.close();
    } else if (mode === 'get') {
      const ch = await conn.createChannel();
      const deadline = Date.now() + Number(arg);
      for (;;) {
        const msg = await ch.get(queue, { noAck: true });
        if (msg) {
          const props = {};
          for (const [k, v] of Object.entries(msg.properties)) {
            if (v !== undefined) props[k] = v;
          }
          process.stdout.write(JSON.stringify({ body: msg.content.toString(), properties: props }) + '\n');
          break;
        }
        if (Date.now() > deadline) throw new Error(`nothing in ${queue} within ${arg} ms`);
        await new Promise((r) => setTimeout(r, 20));
      }
      await ch.close();
    } else {
      throw new Error(`unknown mode ${mode}`);
    }
  } finally {
    await conn.close();
  }
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + '\n');
  process.exit(1);
});
