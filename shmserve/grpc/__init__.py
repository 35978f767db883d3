"""gRPC transport (`inference.GRPCInferenceService`)."""
