"""A job of several processes, one per GPU: each rank's own figures (`ranks`), FSDP2 sharding through
transformers' `DistributedConfig` (`fsdp`), and a sharded job's checkpoints that resume (`checkpoints`)."""
