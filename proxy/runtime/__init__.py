"""Trio-side leaves both the server and the broker side use: frames on streams, memory budgets,
metrics, safe log text, buffers let go of off the event loop."""
