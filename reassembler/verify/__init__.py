"""Stage 2, verify (CONTRACT.md 3): per rollout, select -> cut -> finalize with every record,
token and digest check, all or nothing; advantages; training and audit rows. `shard` runs it
over one shard of a night."""
