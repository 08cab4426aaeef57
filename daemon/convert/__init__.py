"""`adapterd convert`: recipes of other tools turned into requests, every key accounted for."""
