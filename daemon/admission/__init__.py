"""Admission rules: whether a decoded request is taken (this host's TRL, its GPUs, the operator's policy
and bounds, inline images, credential-looking values)."""
