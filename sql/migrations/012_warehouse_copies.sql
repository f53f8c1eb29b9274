-- Version 11 -> 12: the warehouse records its copies in the output store (warehouse/copies.py);
-- sql/schema.sql creates the table. A warehouse of version 11 has made no copy: generation 0.
SELECT 1;
