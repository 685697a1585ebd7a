"""kvpool: the Python client of the kvpool KV-cache block pool.

    import kvpool
    with kvpool.Client("127.0.0.1:7070", tenant="acme", namespace="llama3-8b") as c:
        c.put(key, value)
        n = c.get_into(key, buffer)          # any writable buffer
        with c.view(key) as v:                # zero-copy on the same host
            tensor = v.as_tensor(torch.float16)

Modules: client (Client, View, Reservation), errors (one exception per
kvpool error), chain (chain_keys: prefix-chain keys, vLLM's sha256_cbor
included), kvcache (a paged KV cache saved to and loaded from the pool),
wire (the data channel), daemon (runs kvpool daemons), model and engine
(a small transformer that reuses KV through the pool), bench and demo.
"""

from .chain import chain_keys
from .client import Client, FetchResult, Holder, PutResult, Reservation, View
from .errors import (AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument,
                     KVPoolError, NotFound, PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable)

__all__ = ["Client", "View", "Reservation", "PutResult", "FetchResult", "Holder", "chain_keys", "KVPoolError", "NotFound",
           "AlreadyExists", "ResourceExhausted", "InvalidArgument", "FailedPrecondition", "Unavailable", "DataLoss",
           "Internal", "Unauthenticated", "PermissionDenied", "Cancelled", "DeadlineExceeded"]
