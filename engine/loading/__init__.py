"""Reading checkpoints: Hugging Face safetensors folders and GGUF files."""
