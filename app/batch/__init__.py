"""Offline batch inference in the OpenAI Batch API format: the `chatloom batch` command and the
/v1/files + /v1/batches surface with its background worker."""
