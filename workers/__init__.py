"""Worker side of shmserve: one process per model instance runs a Triton Python-backend model."""
