"""Between the wire and the engine: prompt rendering, tool-call parsing, generation plumbing."""
