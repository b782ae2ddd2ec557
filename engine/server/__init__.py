"""An OpenAI-compatible HTTP server on the dynamic generator: `python -m engine serve MODEL`.

Every request is a job of one DynamicGeneratorAsync, so concurrent requests batch and share cached prefixes.
Starlette routes, uvicorn serves. app.py maps the package; `engine.server.app.create_app(ServedModel(...))`
builds the ASGI app for embedding elsewhere. Nothing is imported here, so `python -m engine` stays quick.
"""
