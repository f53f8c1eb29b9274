-- Rejected input lines of one night by source and kind of error (numbers and hex ids folded
-- so that one kind is one row), with the first lines of each kind.
SELECT source,
       regexp_replace(regexp_replace(error, '[0-9a-f]{12,}', '<id>', 'g'), '[0-9][0-9,]*', 'N', 'g') AS kind,
       count(*) AS n,
       list(file || ':' || coalesce(line::VARCHAR, '?') || '  ' || coalesce(left(raw, 160), '') ORDER BY file, line)[1:3] AS first
FROM rejects
WHERE ds = CAST($ds AS DATE)
GROUP BY ALL
ORDER BY n DESC, source, kind;
