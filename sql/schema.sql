-- Warehouse tables at the current schema version (warehouse.py: SCHEMA_VERSION), created once
-- and kept across nights; older warehouses are brought here by sql/migrations/. Every
-- night-scoped table carries ds. The columns of rollouts and ledger are reassembler/fields.py's,
-- filled in below by warehouse.py.
--
-- A night's rollouts and shard plan are kept per run (the load that wrote them), and readers
-- see only the night's current run, through the views `rollouts` and `shard_plan` below (the
-- per-call views too: sql/call_views.sql). A load of a night no run has published yet is its
-- current run at once; a load of a published night becomes current only when it publishes
-- (sql/publish_audit.sql): a rebuild that fails changes nothing a reader or the report sees.
CREATE TABLE IF NOT EXISTS rollout_runs (
    ds                     DATE    NOT NULL,
    run                    VARCHAR NOT NULL,   -- the run that loaded them (path-safe, as night_calls)
{rollouts_columns}
);

-- The per-call tables (ledger, token_rows, rejects) are Parquet beside the warehouse, one
-- folder per night and run (reassembler/call_tables.py, their columns in sql/night_tables.sql);
-- each night reads the files of the run named here, through views (sql/call_views.sql).
CREATE TABLE IF NOT EXISTS night_calls (
    ds   DATE    NOT NULL,
    run  VARCHAR NOT NULL          -- the night's current run: its rollouts, and its per-call files' folder run=<run>
);

CREATE OR REPLACE VIEW rollouts AS
SELECT r.* EXCLUDE (run) FROM rollout_runs r
SEMI JOIN night_calls c ON c.ds = r.ds AND c.run = r.run;

-- The latest load of each night not yet published: the run that loaded it and the rollouts
-- it read. Publish checks the staged night against it and deletes it; retention keeps the
-- per-call rows of a night held here (a build in flight, or one that failed, for a while).
CREATE TABLE IF NOT EXISTS loads (
    ds          DATE      NOT NULL,
    run_id      VARCHAR,
    n_rollouts  BIGINT    NOT NULL,
    loaded_at   TIMESTAMP NOT NULL,
    run         VARCHAR             -- run_id path-safe: its rows in rollout_runs, its per-call folder
);

-- Groups of the night assigned to shards: contiguous ranges of group_id (per run, as rollout_runs).
CREATE TABLE IF NOT EXISTS shard_plan_runs (
    ds       DATE    NOT NULL,
    group_id VARCHAR NOT NULL,
    shard    INTEGER NOT NULL,
    run      VARCHAR NOT NULL
);

CREATE OR REPLACE VIEW shard_plan AS
SELECT p.* EXCLUDE (run) FROM shard_plan_runs p
SEMI JOIN night_calls c ON c.ds = p.ds AND c.run = p.run;

-- The published audit rows of every night (CONTRACT.md 5.2), for cross-night queries.
CREATE TABLE IF NOT EXISTS audit (
    ds                DATE NOT NULL,
    rollout_id        VARCHAR,
    group_id          VARCHAR,
    slot              INTEGER,
    status            VARCHAR,
    reason            VARCHAR,
    detail            VARCHAR,
    failed_call_id    VARCHAR,
    n_ledger_calls    INTEGER,
    n_selected        INTEGER,
    n_segments        INTEGER,
    n_offchain        INTEGER,
    n_offchain_faults INTEGER,
    n_tokens          BIGINT,
    n_generated       BIGINT,
    reward            DOUBLE,
    advantage         DOUBLE,
    metadata          VARCHAR,
    run_id            VARCHAR,
    n_roots           INTEGER,
    capture           VARCHAR,      -- contract 5.3 (version 5)
    evidence          VARCHAR
);

-- One row per build (CLI or DAG run) that published a night.
CREATE TABLE IF NOT EXISTS runs (
    run_id        VARCHAR NOT NULL,
    ds            DATE    NOT NULL,
    published_at  TIMESTAMP,
    input_dir     VARCHAR,
    mode          VARCHAR,
    offchain      VARCHAR,
    options       VARCHAR,            -- JSON of the build options
    n_rollouts    BIGINT,
    n_ok          BIGINT,
    n_masked      BIGINT,
    n_rows        BIGINT,
    n_rejects     BIGINT,
    seconds       DOUBLE,
    inputs        VARCHAR             -- JSON: each input's location as resolved for the night
);

-- The quality gate's verdict per night (quality.py): ok, or breached with what breached.
CREATE TABLE IF NOT EXISTS quality (
    ds          DATE    NOT NULL,
    run_id      VARCHAR,
    checked_at  TIMESTAMP,
    verdict     VARCHAR NOT NULL,     -- ok | breached
    breaches    VARCHAR              -- JSON list of breaches: check, value, threshold, message
);

-- The copies of this file in the output store (warehouse/copies.py): one row per copy, the
-- newest generation is the file's own; a worker restores the store's copy when its file is older.
CREATE TABLE IF NOT EXISTS warehouse_copies (
    generation  BIGINT  NOT NULL,
    ds          DATE,                 -- the night whose commit (or verdict) made the copy
    run_id      VARCHAR,
    copied_at   TIMESTAMP
);

-- The schema version of this warehouse (warehouse.py applies sql/migrations/ up to it).
CREATE TABLE IF NOT EXISTS schema_version (
    version     INTEGER NOT NULL,
    applied_at  TIMESTAMP
);
