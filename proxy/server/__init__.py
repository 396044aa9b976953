"""The trio server: client connections, admission, forwarding to the broker side, workers."""
