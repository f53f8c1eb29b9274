-- Version 2 -> 3: the token rows' keys kept per night (nights loaded before have none;
-- they are written when a night is loaded again).
CREATE TABLE IF NOT EXISTS token_rows (
    ds              DATE NOT NULL,
    t_staging_key   VARCHAR,
    t_rollout_id    VARCHAR,
    t_model_call_id VARCHAR,
    t_file          VARCHAR,
    t_row           BIGINT
);
