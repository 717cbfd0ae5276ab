"""Server-sent event dialects: one module per dialect, each a mapping of the canonical events."""
