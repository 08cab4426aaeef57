"""What a job needs of its host and what the host has: the job slots (one per GPU), a job's GPU memory
estimated from its request and its models' safetensors headers, and the shard plan that fits it."""
