-- Which capture each rollout of the night is read from (CONTRACT.md 9): the rollouts the load
-- decided on (`captures`: local mode, and mixed captures), then staged for the others with
-- ledger rows (`p_calls`: the parts' counts per rollout), none for the rest (rebuilt lines and given-up samples were set as loaded).
UPDATE rollouts SET capture = c.capture, capture_reason = c.capture_reason, capture_detail = c.capture_detail,
                    capture_call_id = c.capture_call_id
FROM captures c
WHERE rollouts.ds = CAST($ds AS DATE) AND rollouts.rollout_id = c.rollout_id;
UPDATE rollouts SET capture = CASE WHEN rollout_id IN (SELECT rollout_id FROM p_calls WHERE capture IS NULL)
                                   THEN 'staged' ELSE 'none' END
WHERE ds = CAST($ds AS DATE) AND capture IS NULL;
