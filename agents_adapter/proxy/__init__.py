"""The capture proxy (`python -m agents_adapter.proxy`): an OpenAI-compatible HTTP server that records every call at
token level on the bus. A FastAPI program; it imports no torch and no Faust.
"""
