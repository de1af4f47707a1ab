"""Keeping a store whole: scrubbing runs for damage (`scrub`, what `actstore verify` runs) and
recreating a lost catalog from the store alone (`rebuild`)."""
