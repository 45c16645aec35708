"""Pydantic models of the wire: requests we accept and responses we send, mirroring the OpenAI SDK
types (each docstring names its SDK counterpart; `openai.types...`)."""
