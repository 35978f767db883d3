"""HTTP/REST transport (KServe v2 with Triton's extensions)."""
