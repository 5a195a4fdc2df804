"""perflab engine plugin (being written)."""
