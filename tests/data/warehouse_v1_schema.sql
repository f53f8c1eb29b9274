-- Warehouse tables (created once, kept across nights). Every night-scoped table carries ds.
CREATE TABLE IF NOT EXISTS rollouts (
    ds                     DATE    NOT NULL,
    rollout_seq            BIGINT  NOT NULL,   -- input order inside the night
    rollout_id             VARCHAR NOT NULL,
    group_id               VARCHAR NOT NULL,
    slot                   INTEGER NOT NULL,
    reward                 DOUBLE,
    reward_problem         VARCHAR,            -- why reward is null: invalid_reward detail
    failure_reason         VARCHAR,
    terminal_model_call_id VARCHAR,
    generated_items        STRUCT(id VARCHAR, fingerprint VARCHAR)[],
    n_output_items         INTEGER,
    metadata               VARCHAR,
    source_file            VARCHAR,
    source_line            BIGINT
);

CREATE TABLE IF NOT EXISTS ledger (
    ds                     DATE    NOT NULL,
    capture_seq            BIGINT  NOT NULL,   -- capture order: files by path, then line
    rollout_id             VARCHAR NOT NULL,
    model_call_id          VARCHAR NOT NULL,
    parent_call_id         VARCHAR,
    mode                   VARCHAR,
    prev_len               BIGINT,
    delta_len              BIGINT,
    cum_len                BIGINT,
    weight_version         BIGINT,
    schema_version         BIGINT,
    digest_version         BIGINT,
    extras_digest_version  BIGINT,
    digest                 VARCHAR,
    extras_digest          VARCHAR,
    chain_hash             VARCHAR,
    cumulative_hash        VARCHAR,
    staging_key            VARCHAR NOT NULL,
    response_id            VARCHAR,
    admitted_at            DOUBLE,
    output_items           STRUCT(id VARCHAR, fingerprint VARCHAR)[],
    failure_reason         VARCHAR,
    source_file            VARCHAR,
    source_line            BIGINT
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
    n_roots           INTEGER
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
    seconds       DOUBLE
);
