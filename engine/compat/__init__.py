"""Compatibility layers: other engines' public names over Tandem's engine (see `engine.compat.exllamav2`)."""
