"""Merlin's OpenAI-compatible HTTP server (`merlin-cli serve`).

Layout, one job per module:
- schema.py: the request body -> a checked ChatRequest (ApiError naming the field), Limits
- images.py: `image_url` -> an image file (data: URLs, paths inside one allowed folder)
- engine_adapter.py: the only user of engine.session: a pool of sessions reusing KV prefixes
  and image embeddings across requests, stop strings, profile totals
- queue.py: one generation at a time on one thread, a bounded queue (429 when full)
- responses.py: engine events -> chat.completion objects, SSE chunks, usage
- app.py: the Starlette app (routes, auth, bounded bodies, errors, streaming, cancellation)
- cli.py: `merlin-cli serve` (arguments, key policy, socket, uvicorn)

Starlette and uvicorn (`merlin[server]`) are imported by app.py and cli.run only, so the rest
of Merlin works without them. Starlette because it is the small, well-kept ASGI toolkit that
FastAPI is built on: routing, streaming responses, CORS and disconnect detection without the
validation layer (the schema here names fields in OpenAI's error format); uvicorn because it
is the standard ASGI server with h11 only, no compiled extras needed.
"""
