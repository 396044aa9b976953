"""Kafka's bytes: bounds-checked wire primitives, the codec compiled from
Kafka's message schemas (via kio), frames, headers, API keys and error codes.

No routing policy, no trio, no clock: this package imports only the standard
library and kio, and every other part of kfan builds on it.
"""
