"""Chatting with documents: .txt, .md, .pdf and .docx files attached to a message.

    extract.py   a file's text, by page or heading; clear refusals (scans, passwords, damage, size)
    passages.py  the text cut into passages of a few hundred tokens, on paragraph boundaries
    attach.py    at attach time: read, counted with the model's tokenizer, cut; at send time: stored
    prompt.py    at each answer: whole documents, or the passages that best match the question, and sources

The store keeps the documents, their passages and the FTS5 index that ranks them (app/store/documents.py);
the window shows them (app/ui/attachments.py, app/ui/message_documents.py).
"""
