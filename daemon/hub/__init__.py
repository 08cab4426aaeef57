"""Publishing: one Hub commit of the artifact and its model card (or the local sink)."""
