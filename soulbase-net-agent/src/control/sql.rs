//! The control plane's schema and statements: one text for SQLite and PostgreSQL, the
//! differences taken from the store crate's [`Dialect`] (the store's clock, placeholders, how a
//! write transaction begins) and the few named here (a lease's token, a list of ids, row locks).

use soulbase_net_store::sql::{Dialect, Migration};

/// The table that records the schema's versions is `control_migrations`.
pub(super) const MIGRATIONS_TABLE: &str = "control";

/// The schema's versions, oldest first, for an engine whose auto-numbered key is `$seq`: one
/// text for both engines (a macro because a [`Migration`] holds `'static` text, which only
/// `concat!` of literals assembles). Version 1 is the first slice's schema (`IF NOT EXISTS`: a
/// file it made is adopted as it is); `BIGINT` is SQLite's `INTEGER` by affinity.
macro_rules! migrations {
    ($seq:literal) => {
        &[
            (
                1,
                "agents, tasks with their current lease, results",
                &[
                    "CREATE TABLE IF NOT EXISTS agents (
                        id TEXT PRIMARY KEY,
                        token_hash TEXT NOT NULL,
                        session BIGINT NOT NULL,
                        info TEXT NOT NULL,
                        registered_at BIGINT NOT NULL,
                        last_seen BIGINT NOT NULL
                    )",
                    "CREATE TABLE IF NOT EXISTS tasks (
                        id TEXT PRIMARY KEY,
                        kind TEXT NOT NULL,
                        spec TEXT NOT NULL,
                        every_ms BIGINT,
                        next_at BIGINT NOT NULL,
                        state TEXT NOT NULL,
                        lease_id TEXT,
                        agent_id TEXT,
                        lease_until BIGINT,
                        claims BIGINT NOT NULL DEFAULT 0,
                        created_at BIGINT NOT NULL
                    )",
                    "CREATE INDEX IF NOT EXISTS tasks_due ON tasks (state, kind, next_at)",
                    "CREATE UNIQUE INDEX IF NOT EXISTS tasks_lease ON tasks (lease_id)",
                    concat!(
                        "CREATE TABLE IF NOT EXISTS results (
                        seq ",
                        $seq,
                        ",
                        task_id TEXT NOT NULL,
                        lease_id TEXT NOT NULL UNIQUE,
                        agent_id TEXT NOT NULL,
                        status TEXT NOT NULL,
                        observations TEXT NOT NULL,
                        error TEXT,
                        reported_at BIGINT NOT NULL
                    )"
                    ),
                    "CREATE INDEX IF NOT EXISTS results_task ON results (task_id, seq)",
                ],
            ),
            (
                2,
                "stale agents: when an agent was found stale, and the leases held by agent",
                &[
                    "ALTER TABLE agents ADD COLUMN stale_at BIGINT",
                    "CREATE INDEX IF NOT EXISTS agents_seen ON agents (last_seen)",
                    "CREATE INDEX IF NOT EXISTS agents_stale ON agents (stale_at)",
                    "CREATE INDEX IF NOT EXISTS tasks_agent ON tasks (agent_id)",
                ],
            ),
        ]
    };
}

/// SQLite's schema versions.
pub(super) const SQLITE_MIGRATIONS: &[Migration] = migrations!("INTEGER PRIMARY KEY AUTOINCREMENT");

/// PostgreSQL's schema versions.
#[cfg(feature = "postgres")]
pub(super) const POSTGRES_MIGRATIONS: &[Migration] = migrations!("BIGSERIAL PRIMARY KEY");

/// The schema version this build migrates to.
pub(super) const SCHEMA_VERSION: i64 = 2;

/// The statements, built once when the store opens.
#[derive(Clone, Debug)]
pub(super) struct Statements {
    /// How a write transaction begins (see [`Dialect::begin`]).
    pub(super) begin: &'static str,
    pub(super) register: String,
    pub(super) resume: String,
    pub(super) authenticate: String,
    pub(super) heartbeat: String,
    pub(super) create: String,
    pub(super) claim: String,
    pub(super) extend: String,
    pub(super) fence_report: String,
    pub(super) record_result: String,
    pub(super) earlier_result: String,
    pub(super) revoke: String,
    pub(super) cancel: String,
    pub(super) task: String,
    pub(super) results: String,
    pub(super) counts: String,
    pub(super) mark_stale: String,
    pub(super) return_leases: String,
    pub(super) agents: String,
}

impl Statements {
    pub(super) fn new(dialect: Dialect) -> Self {
        let now = dialect.now();
        // A lease's token, drawn for each row by the claim statement itself: 128 random bits
        // (SQLite), 122 from PostgreSQL's `gen_random_uuid()` (built in since version 13).
        // The ids an extension names, bound as one JSON array of strings. The row locks of a
        // claim and a sweep: rows another instance is taking right now are skipped, not waited
        // for (and never taken twice).
        let (token, ids, lock) = match dialect {
            Dialect::Sqlite => (
                "lower(hex(randomblob(16)))",
                "SELECT value FROM json_each(?)",
                "",
            ),
            Dialect::Postgres => (
                "replace(CAST(gen_random_uuid() AS TEXT), '-', '')",
                "SELECT jsonb_array_elements_text(CAST(? AS JSONB))",
                "FOR UPDATE SKIP LOCKED",
            ),
        };
        let place = |sql: String| dialect.place(sql);
        Self {
            begin: dialect.begin(),
            register: place(format!(
                "INSERT INTO agents (id, token_hash, session, info, registered_at, last_seen)
                 VALUES (?, ?, 1, ?, {now}, {now}) ON CONFLICT (id) DO NOTHING"
            )),
            resume: place(format!(
                "UPDATE agents SET session = session + 1, info = ?, last_seen = {now},
                    stale_at = NULL
                 WHERE id = ? AND token_hash = ? RETURNING session"
            )),
            authenticate: place("SELECT 1 FROM agents WHERE id = ? AND token_hash = ?".into()),
            // A stale agent that beats again is live again (its leases stay returned).
            heartbeat: place(format!(
                "UPDATE agents SET last_seen = {now}, stale_at = NULL WHERE id = ?
                 RETURNING session"
            )),
            create: place(format!(
                "INSERT INTO tasks (id, kind, spec, every_ms, next_at, state, created_at)
                 VALUES (?, ?, ?, ?, {now}, 'pending', {now}) ON CONFLICT (id) DO NOTHING"
            )),
            // One statement: the select and the lease. Only for an agent heard from within the
            // stale threshold: what a stale agent took would be taken back by the next sweep.
            claim: place(format!(
                "UPDATE tasks SET lease_id = {token}, agent_id = ?, lease_until = {now} + ?,
                    claims = claims + 1
                 WHERE id IN (SELECT c.id FROM tasks c
                              WHERE c.state = 'pending' AND c.kind = ? AND c.next_at <= {now}
                                AND (c.lease_until IS NULL OR c.lease_until <= {now})
                                AND EXISTS (SELECT 1 FROM agents a
                                            WHERE a.id = ? AND a.last_seen > {now} - ?)
                              ORDER BY c.next_at LIMIT ? {lock})
                 RETURNING id, spec, lease_id, claims"
            )),
            extend: place(format!(
                "UPDATE tasks SET lease_until = {now} + ?
                 WHERE agent_id = ? AND state = 'pending' AND lease_id IN ({ids})
                 RETURNING lease_id"
            )),
            // The token fences: a lease taken over, revoked or returned has another (or none).
            fence_report: place(format!(
                "UPDATE tasks SET lease_id = NULL, agent_id = NULL, lease_until = NULL,
                    state = CASE WHEN every_ms IS NULL THEN 'done' ELSE state END,
                    next_at = CASE WHEN every_ms IS NULL THEN next_at ELSE {now} + every_ms END
                 WHERE id = ? AND lease_id = ? AND agent_id = ? AND state = 'pending'"
            )),
            record_result: place(format!(
                "INSERT INTO results (task_id, lease_id, agent_id, status, observations, error,
                    reported_at)
                 VALUES (?, ?, ?, ?, ?, ?, {now})"
            )),
            earlier_result: place(
                "SELECT 1 FROM results WHERE lease_id = ? AND agent_id = ? AND task_id = ?".into(),
            ),
            revoke: place(
                "UPDATE tasks SET lease_id = NULL, agent_id = NULL, lease_until = NULL
                 WHERE lease_id = ?"
                    .into(),
            ),
            cancel: place(
                "UPDATE tasks SET state = 'cancelled', lease_id = NULL, agent_id = NULL,
                    lease_until = NULL
                 WHERE id = ? AND state != 'cancelled'"
                    .into(),
            ),
            task: place(format!(
                "SELECT spec, every_ms, state, claims, agent_id, lease_id,
                    COALESCE(lease_id IS NOT NULL AND lease_until > {now}, FALSE) AS leased,
                    (SELECT COUNT(*) FROM results WHERE task_id = tasks.id) AS results
                 FROM tasks WHERE id = ?"
            )),
            results: place(
                "SELECT lease_id, agent_id, status, observations, error, reported_at
                 FROM results WHERE task_id = ? ORDER BY seq DESC LIMIT ?"
                    .into(),
            ),
            counts: place(format!(
                "SELECT
                    (SELECT COUNT(*) FROM tasks WHERE state = 'pending'
                        AND (lease_id IS NULL OR lease_until <= {now})) AS pending,
                    (SELECT COUNT(*) FROM tasks WHERE state = 'pending'
                        AND lease_id IS NOT NULL AND lease_until > {now}) AS leased,
                    (SELECT COUNT(*) FROM tasks WHERE state = 'done') AS done,
                    (SELECT COUNT(*) FROM tasks WHERE state = 'cancelled') AS cancelled,
                    (SELECT COUNT(*) FROM agents) AS agents,
                    (SELECT COUNT(*) FROM agents WHERE last_seen > {now} - ?) AS agents_live"
            )),
            // Conditional on `stale_at IS NULL`: each agent is marked once, by one instance.
            mark_stale: place(format!(
                "UPDATE agents SET stale_at = {now}
                 WHERE stale_at IS NULL AND last_seen <= {now} - ?
                 RETURNING id"
            )),
            // Every lease held by an agent marked stale (by this sweep or an earlier one, and
            // not beating since), run out or not, is returned: due at once (its `next_at` has
            // passed) and its token gone, so the agent's late extension or report is refused.
            // The mark decides, not the clock again: an agent whose leases are returned is
            // always one found stale. Rows a claim or another sweep holds are skipped (the
            // next sweep sees them if they are still the stale agent's).
            return_leases: place(format!(
                "UPDATE tasks SET lease_id = NULL, agent_id = NULL, lease_until = NULL
                 WHERE id IN (SELECT t.id FROM tasks t
                              WHERE t.state = 'pending' AND t.lease_id IS NOT NULL
                                AND t.agent_id IN (SELECT a.id FROM agents a
                                                   WHERE a.stale_at IS NOT NULL)
                              {lock})
                 RETURNING id"
            )),
            agents: place(format!(
                "SELECT id, session, info, registered_at, last_seen, stale_at,
                    COALESCE(last_seen <= {now} - ?, FALSE) AS stale,
                    (SELECT COUNT(*) FROM tasks t WHERE t.agent_id = agents.id
                        AND t.state = 'pending' AND t.lease_id IS NOT NULL
                        AND t.lease_until > {now}) AS leases
                 FROM agents ORDER BY id"
            )),
        }
    }
}
