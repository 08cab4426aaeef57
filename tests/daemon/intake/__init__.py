"""What intake makes of every input: the admission rules (policy, images, Hub ids), hostile requests and records,
fuzzing, in process and sent to a running daemon."""
