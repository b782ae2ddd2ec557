"""What every vision-language family shares: the one door images come in by (image.py: read, check, decode,
hash), MMEmbedding and its ids (embedding.py), images in chat prompts (prompt.py), the vision handle's base
(handle.py), processor options and pixel arithmetic (options.py, pixels.py) and the layers towers are built
from (layers.py). Each family's own tower, processor and model live in engine/models/<family>/."""
