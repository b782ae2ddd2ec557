"""GGUF files: the header reader, tensor names and shapes, one tensor's data, a whole checkpoint."""
