"""Triton's protocol extensions and server features that the request core applies but does
not need to be read: client shared-memory regions, classification, the response cache,
restricted APIs, header forwarding.

Transport-neutral: the HTTP and gRPC routes of an extension live with their transport
(e.g. http/region_routes.py), so nothing here imports a transport.
"""
