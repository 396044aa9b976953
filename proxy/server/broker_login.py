"""The client's own credentials tried on a broker, before the client is told it logged in (trio).

With ``--broker-identity client`` kfan's broker links log in as the client.
:func:`confirm_login` is the check its SASL session
(:class:`proxy.server.client_auth.ClientSession`) makes before answering a login:
one of the connection's links logs in with the new credentials, and the
broker's verdict is the client's.

Boundaries: it only opens (or re-authenticates) a link and reports; the
session decides what the client is answered.
"""

from __future__ import annotations

import trio

from backends.links import Lane, LinkPool
from backends.sasl import relogin_confirmed


async def confirm_login(links: LinkPool, timeout: float, *, relogin: bool) -> str | None:
    """None if a broker took the credentials the links now log in with; else why not.

    ``relogin``: the client was logged in already (a re-authentication): the open
    link logs in again with the new credentials, before the client is answered.
    """
    broker = links.default_broker()
    link = None if broker is None else links.link(broker, Lane.MAIN)
    if link is None:
        return "no broker is reachable"
    with trio.move_on_after(timeout):
        await link.ready.wait()
    if not link.ready.is_set():
        link.close()
        return f"broker {broker} did not answer the login within {timeout:.0f} s"
    if link.failed is not None:
        return str(link.failed)
    if relogin:
        with trio.move_on_after(timeout):
            return await relogin_confirmed(link)
        link.close()
        return f"broker {broker} did not answer the login within {timeout:.0f} s"
    return None
