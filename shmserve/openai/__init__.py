"""OpenAI-compatible routes (/v1/models, /v1/completions, /v1/chat/completions,
/v1/embeddings) for the repository's models, served on the HTTP port and on --openai-port.
See docs/openai.md."""
