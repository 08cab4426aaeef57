"""Children: the processes that train (a child, the fork server that forks it, the warm pool)."""
