"""Tokenizers: Hugging Face folders, sentencepiece models and GGUF vocabularies behind one class."""
