"""Assistant turns: replay the stored history, run the engine, execute tool calls as webhooks."""
