"""Model configuration: config.json or GGUF metadata parsed into one frozen dataclass."""
