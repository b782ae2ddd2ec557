"""The one front door from a chat to a job: messages, images and answer settings in, a DynamicJobAsync out.

The app's local backend and the OpenAI-compatible server both go through it, so a conversation becomes the
same prompt ids, the same context check and the same job wherever it comes from.

    request.py   ChatRequest (the conversation) and AnswerOptions (how to generate the answer)
    door.py      ChatFrontDoor: images -> embeddings, chat -> prompt ids, room in the context, ids -> a job
    prompt.py    encode_chat: messages + image embeddings -> the chat template's prompt ids
    images.py    EmbeddingCache: one model's image embeddings by the sha256 of their bytes
    errors.py    ContextOverflow and NoVisionError, which each caller words for its own users

Nothing is imported here: importers name the module they need.
"""
