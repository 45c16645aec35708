"""Conversations in SQL: sessions, messages (with tool calls and results), assistants, and the
n8n_chat_histories mirror that n8n's Postgres Chat Memory node reads and writes."""
