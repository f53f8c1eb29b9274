-- Version 1 -> 2: NeMo Gym 0.7.0 capture (contract v2) and the capture-quality gate.
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS terminal_response_id VARCHAR;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS model_items STRUCT(output_index INTEGER, field BLOB)[];
ALTER TABLE ledger ADD COLUMN IF NOT EXISTS output_fingerprint VARCHAR;
ALTER TABLE ledger ADD COLUMN IF NOT EXISTS fingerprint_version BIGINT;
CREATE TABLE IF NOT EXISTS quality (
    ds          DATE    NOT NULL,
    run_id      VARCHAR,
    checked_at  TIMESTAMP,
    verdict     VARCHAR NOT NULL,
    breaches    VARCHAR
);
