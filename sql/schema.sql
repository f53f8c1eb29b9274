-- Warehouse tables at the current schema version (warehouse.py: SCHEMA_VERSION), created once
-- and kept across nights; older warehouses are brought here by sql/migrations/. Every
-- night-scoped table carries ds. The columns of rollouts and ledger are reassembler/fields.py's,
-- filled in below by warehouse.py.
CREATE TABLE IF NOT EXISTS rollouts (
    ds                     DATE    NOT NULL,
{rollouts_columns}
);

CREATE TABLE IF NOT EXISTS ledger (
    ds                     DATE    NOT NULL,
{ledger_columns}
);

-- Where each token row of a night sits (file, 0-based row) and which ledger row asks for it
-- (staging_key), written by the load from the token files' scalar columns
-- (load/token_keys.py): the shards join calls to it instead of reading the files' keys again.
CREATE TABLE IF NOT EXISTS token_rows (
    ds              DATE NOT NULL,
    t_staging_key   VARCHAR,
    t_rollout_id    VARCHAR,
    t_model_call_id VARCHAR,
    t_file          VARCHAR,
    t_row           BIGINT
);

-- Input that could not be loaded as a record, one row per line / token row.
CREATE TABLE IF NOT EXISTS rejects (
    ds            DATE    NOT NULL,
    source        VARCHAR NOT NULL,   -- rollouts | ledger | tokens
    file          VARCHAR NOT NULL,
    line          BIGINT,             -- 1-based line, or 0-based row for Parquet
    error         VARCHAR NOT NULL,
    raw           VARCHAR,            -- the line, cut short
    rollout_id    VARCHAR,            -- when it could be read
    model_call_id VARCHAR
);

-- The latest load of each night not yet published: the run that loaded it and the rollouts
-- it read. Publish checks the staged night against it and deletes it; retention keeps the
-- per-call rows of a night held here (a build in flight, or one that failed, for a while).
CREATE TABLE IF NOT EXISTS loads (
    ds          DATE      NOT NULL,
    run_id      VARCHAR,
    n_rollouts  BIGINT    NOT NULL,
    loaded_at   TIMESTAMP NOT NULL
);

-- Groups of the night assigned to shards: contiguous ranges of group_id.
CREATE TABLE IF NOT EXISTS shard_plan (
    ds       DATE    NOT NULL,
    group_id VARCHAR NOT NULL,
    shard    INTEGER NOT NULL
);

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

-- The schema version of this warehouse (warehouse.py applies sql/migrations/ up to it).
CREATE TABLE IF NOT EXISTS schema_version (
    version     INTEGER NOT NULL,
    applied_at  TIMESTAMP
);
