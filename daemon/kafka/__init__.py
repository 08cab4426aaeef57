"""Kafka I/O: the clients and the records they carry, the topics, the publisher of events and dead
letters, ordered commits, the control topic, trace context and the daemon's signed retry headers."""
