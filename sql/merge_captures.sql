-- Each local-mode capture key of the night (`capture_keys`: key and entries file, from the
-- night's listing) with what the merge decides it on (gym_capture.decide): whether a
-- rollout of the night has that id (a loaded line or a given-up sample), read from its
-- own line (a rebuilt line, a verifiers trace, an envelope line: CONTRACT.md 9.10, 10.3, 11.2), or has ledger rows
-- of its own; and the outcome of the part that read it.
SELECT c.rollout_id, c.entries,
       r.rollout_id IS NOT NULL AS is_rollout,
       coalesce(r.capture IN ('rebuilt', 'verifiers', 'envelope', 'art'), false) AS from_line,
       s.rollout_id IS NOT NULL AS staged,
       o.part, o.n_lines, o.capture_reason, o.capture_detail, o.capture_call_id, o.error
FROM capture_keys c
LEFT JOIN (SELECT rollout_id, capture FROM rollouts WHERE ds = CAST($ds AS DATE)) r USING (rollout_id)
LEFT JOIN (SELECT DISTINCT rollout_id FROM p_calls WHERE capture IS NULL) s USING (rollout_id)
LEFT JOIN p_outcomes o USING (rollout_id)
ORDER BY c.rollout_id;
