"""Dependencies in statements (migration 0026): the runs a run waits for, recorded at its
enqueue, and read by `show` and the dashboard.

Run by cronjob.store.dependencies. A parent's finish decides its waiting runs in the
database itself (the trigger job_runs_parent_finished, in the transaction of that finish).
"""

from __future__ import annotations

from cronjob.queries import _NOW

# The ids among those given that name no run: refused before the enqueue writes anything.
DEPENDENCIES_LIST_UNKNOWN = "SELECT jobrunner_runs_unknown(%(ids)s::bigint[])"

# Each edge (run, parent, policy), of runs the transaction just inserted: each run waits, or is
# due or cancelled at once if its parents have ended already.
DEPENDENCIES_INSERT_MANY = f"""
SELECT jobrunner_runs_wait(%(runs)s::bigint[], %(parents)s::bigint[], %(policies)s::text[],
                           {_NOW})
"""

# The runs a run waits for, and those that wait for it, with their statuses: the first
# %(limit)s of each side by id, and how many each side holds (a run may wait for thousands).
# Each side is read on its own index (the primary key's parent_id, job_run_dependencies_run).
DEPENDENCIES_GET = """
(SELECT 'parent' AS side, p.id, p.status, d.policy
 FROM job_run_dependencies d JOIN job_runs p ON p.id = d.parent_id
 WHERE d.run_id = %(id)s ORDER BY d.parent_id LIMIT %(limit)s)
UNION ALL
(SELECT 'child', c.id, c.status, d.policy
 FROM job_run_dependencies d JOIN job_runs c ON c.id = d.run_id
 WHERE d.parent_id = %(id)s ORDER BY d.run_id LIMIT %(limit)s)
"""

DEPENDENCIES_COUNT = """
SELECT (SELECT count(*) FROM job_run_dependencies WHERE run_id = %(id)s),
       (SELECT count(*) FROM job_run_dependencies WHERE parent_id = %(id)s)
"""
