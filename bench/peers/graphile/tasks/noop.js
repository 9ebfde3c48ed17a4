// The no-op task for graphile-worker's benchmark runs (taskDirectory: bench/peers/graphile/tasks).
module.exports = async () => {};
