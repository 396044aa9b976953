"""Security at kfan's two edges: TLS contexts (clients and brokers), SASL
mechanisms as sans-IO exchanges (kfan as a SASL client to the brokers, and as
a SASL server to its clients), the users file and JWT checks for OAUTHBEARER.

Nothing here does I/O but reading the files it is pointed at; the trio layer
and the broker links drive the exchanges.
"""
