"""Where a job's data lives: checkpoint stores (a shared folder, moto's S3, the GCS emulator, Azurite), dataset sources
read by a running daemon, the Hub push, job folders' retention."""
