"""kfan's client-facing side: the sans-IO core (frames, headers, codec, routing,
split/merge/rewrite) and the trio layer that serves client connections."""
