-- One rollout's items (formats/fields.py: ITEMS), from the per-call table rollout_items of
-- the night's current run (none: a given-up sample, or not in the warehouse).
SELECT generated_items, model_items, trace
FROM rollout_items
WHERE ds = CAST($ds AS DATE) AND rollout_id = $rollout_id
