-- The buckets of a query that reads one rollout (explain): shaped like plan_buckets.sql's, no rows.
(SELECT NULL::VARCHAR AS rollout_id, NULL::BIGINT AS bucket WHERE false)
