"""What the night's files hold, byte for byte: the fields of rollout and ledger records, their
JSON shapes, the token-file format, the fingerprints and digests, and the input folder's
layout. Beneath every stage; nothing here reads the warehouse."""
