"""Where a study's runs execute: here (local) or on a Ray cluster (ray)."""
