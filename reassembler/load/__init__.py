"""Stage 1, load: a night's input files into the warehouse (rollout lines, ledger lines, the
token rows' keys), every line loaded or a reject row; and the token rows read back, by file
and row, for verification."""
