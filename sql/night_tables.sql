-- The per-call tables of the night (and the rollouts' per-call fields, rollout_items) a load is writing (reassembler/call_tables.py: open_night),
-- temporary tables of one connection named as the views they shadow; written out as Parquet
-- beside the warehouse once the night is merged. Their columns are the files' (with ds).
CREATE TEMP TABLE ledger (
    ds                     DATE    NOT NULL,
{ledger_columns}
);

-- Where each token row of a night sits (file, 0-based row) and which ledger row asks for it
-- (staging_key), written by the load from the token files' scalar columns
-- (load/token_keys.py): the shards join calls to it instead of reading the files' keys again.
CREATE TEMP TABLE token_rows (
    ds              DATE NOT NULL,
    t_staging_key   VARCHAR,
    t_rollout_id    VARCHAR,
    t_model_call_id VARCHAR,
    t_file          VARCHAR,
    t_row           BIGINT
);

-- Input that could not be loaded as a record, one row per line / token row.
CREATE TEMP TABLE rejects (
    ds            DATE    NOT NULL,
    source        VARCHAR NOT NULL,   -- rollouts | ledger | tokens
    file          VARCHAR NOT NULL,
    line          BIGINT,             -- 1-based line, or 0-based row for Parquet
    error         VARCHAR NOT NULL,
    raw           VARCHAR,            -- the line, cut short
    rollout_id    VARCHAR,            -- when it could be read
    model_call_id VARCHAR
);


-- A rollout's fields that grow with its calls (formats/fields.py: ROLLOUT_ITEMS), one row per
-- rollout read from a line; the warehouse's rollout rows hold the others. Join on ds, rollout_id.
CREATE TEMP TABLE rollout_items (
    ds                     DATE    NOT NULL,
{items_columns}
);
