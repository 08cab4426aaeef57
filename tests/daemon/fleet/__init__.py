"""The fleet as one queue: its order, ETAs, usage and the dispatcher's queues in process, and real daemons sharing the
class topics on the broker."""
