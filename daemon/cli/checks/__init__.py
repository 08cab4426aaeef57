"""The operator's checks of a host before it serves: `adapterd doctor` (brokers, topics, the Hub, GPUs),
`adapterd validate -c` (the settings and the memory plan), the checkpoint store (its line in `adapterd doctor`)
and the topics report."""
