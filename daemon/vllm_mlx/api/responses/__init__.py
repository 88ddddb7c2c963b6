"""The OpenAI Responses API (/v1/responses): schema, convert, stream, store, routes."""
