"""The contract a plugin programs against: hookspecs, the engine base, types, status, errors."""
