"""shmserve: a Triton-compatible inference server for Python-backend models."""

__version__ = "0.1.0"
