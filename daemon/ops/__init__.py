"""Operations: what the operator watches and the host expects (logs, metrics, the health
endpoint, systemd notifications)."""
