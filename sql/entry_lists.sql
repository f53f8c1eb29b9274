-- A batch of NeMo Gym TokenEntry lines' token lists, read by DuckDB's JSON reader as the
-- relation `entries` (load/entry_reader.py), one row a non-blank line, in line order: each
-- row's ids are its prompt's, then its generated ids (an absent list counts as none), and
-- the file it was read from.
SELECT list_concat(coalesce(prompt_token_ids, []), coalesce(generation_token_ids, [])) AS ids,
       coalesce(len(prompt_token_ids), 0) AS n_prompt,
       prompt_token_ids IS NOT NULL AS has_prompt,
       generation_token_ids IS NOT NULL AS has_generated,
       generation_log_probs AS logprobs,
       filename
FROM entries
