-- Version 3 -> 4: each night's latest load, held until it is published (retention keeps
-- the per-call rows of a held night; publish checks the rollouts it loaded).
CREATE TABLE IF NOT EXISTS loads (
    ds          DATE      NOT NULL,
    run_id      VARCHAR,
    n_rollouts  BIGINT    NOT NULL,
    loaded_at   TIMESTAMP NOT NULL
);
