"""The error a SASL check fails with, on either side of kfan.

It sits below both modules that raise it: the mechanisms' exchanges
(:mod:`.sasl`) and the OAUTHBEARER token check they call (:mod:`.oauth`),
so that neither imports the other to raise it.
"""

from __future__ import annotations


class SaslError(Exception):
    """A peer's SASL message is malformed or fails a check; the message is safe to log (no password, no token)."""
