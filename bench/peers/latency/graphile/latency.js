// bench/latency.py's task for graphile-worker: notes when each job started, as Unix time.
const fs = require("fs");
const log = fs.openSync(process.env.LATENCY_LOG, "a");
module.exports = async (payload) => {
  const started = (performance.timeOrigin + performance.now()) / 1000;
  fs.writeSync(log, `${payload.k} ${started.toFixed(6)}\n`);
};
