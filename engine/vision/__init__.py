"""Images for vision-language models: decoding, preprocessing, and the embeddings a job carries."""
