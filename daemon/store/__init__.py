"""What is kept on disk and in the operator's checkpoint store: the store itself and the signed documents
the fleet writes there, a job's checkpoints on this host and its journal, and retention on both."""
