"""The effects ledger: a business key recorded once per effect, and its retention.

Run by cronjob.store.effects.
"""

from __future__ import annotations

from cronjob.queries import _NOW, _lease_fence

# Exactly once: inside ctx.db, so the key commits with the run's success or not
# at all. A key inserted by a concurrent, still open transaction makes this wait
# for it: False if that run succeeds, True if it rolls back.
EFFECT_INSERT_ONCE = """
INSERT INTO job_effects (key, run_id, attempt, kind)
VALUES (%(key)s, %(run_id)s, %(attempt)s, 'once')
ON CONFLICT (key) DO NOTHING
RETURNING 1
"""

# At most once: committed on its own before the effect, and only while the run
# still holds its lease, so a worker that lost its run starts nothing new.
EFFECT_INSERT_AT_MOST_ONCE = f"""
WITH held AS (
    SELECT id, attempts FROM job_runs
    WHERE id = %(run_id)s AND {_lease_fence("%(token)s")}
),
recorded AS (
    INSERT INTO job_effects (key, run_id, attempt, kind)
    SELECT %(key)s, id, attempts, 'at_most_once' FROM held
    ON CONFLICT (key) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM held), EXISTS (SELECT 1 FROM recorded)
"""

# Retention: a key goes once its run is gone (pruned) and it is older than the
# retention. A key whose run still exists is kept whatever its age: that run may
# still be retried, and forgetting the key would repeat the effect.
EFFECTS_PRUNE_MANY = f"""
WITH doomed AS (
    SELECT e.key FROM job_effects e
    WHERE e.created_at < {_NOW} - make_interval(secs => %(older_than)s)
      AND NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.id = e.run_id)
    ORDER BY e.created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM job_effects e USING doomed d
WHERE e.key = d.key
"""
