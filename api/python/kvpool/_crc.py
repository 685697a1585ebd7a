"""CRC-32C (Castagnoli), the checksum every kvpool block carries.

Debian's python3-crc32c is built without its SSE4.2 path and runs at about
2 GB/s, below the speed of a loopback socket, which would make checking a
received block cost more than receiving it. Intel's ISA-L (Debian's
libisal2) computes the same CRC with carry-less multiplication at tens of
GB/s and releases the GIL while it runs (ctypes). This module uses ISA-L
when the library loads, python3-crc32c otherwise; both are checked against
the standard check value at import, so a wrong binding cannot pass
unnoticed.
"""

import ctypes
import ctypes.util

import numpy as np

try:
    import crc32c as _crc32c_module
except ImportError:  # pragma: no cover - exercised only without the package
    _crc32c_module = None

_CHECK = (b"123456789", 0xE3069283)  # the CRC-32C check value (RFC 3720)


def _load_isal():
    for name in ("libisal.so.2", ctypes.util.find_library("isal")):
        if not name:
            continue
        try:
            fn = ctypes.CDLL(name).crc32_iscsi
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_uint32
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        return fn
    return None


_isal = _load_isal()
_CHUNK = 1 << 30  # crc32_iscsi takes an int length


def _address(buf):
    """The address and length of any contiguous buffer, read-only ones too."""
    a = np.frombuffer(buf, dtype=np.uint8)
    return a.ctypes.data, a.size


if _isal is not None:
    BACKEND = "isa-l"

    def crc32c(buf, value=0):
        """CRC-32C of buf, continuing from value (the CRC of what came before)."""
        addr, n = _address(buf)
        crc = value ^ 0xFFFFFFFF
        for off in range(0, n, _CHUNK):
            crc = _isal(addr + off, min(_CHUNK, n - off), crc)
        return crc ^ 0xFFFFFFFF

elif _crc32c_module is not None:  # pragma: no cover - without libisal2
    BACKEND = "crc32c"

    def crc32c(buf, value=0):
        """CRC-32C of buf, continuing from value (the CRC of what came before)."""
        return _crc32c_module.crc32c(buf, value)

else:  # pragma: no cover
    raise ImportError("kvpool needs libisal2 or python3-crc32c for CRC-32C")

if crc32c(_CHECK[0]) != _CHECK[1] or crc32c(_CHECK[0][5:], crc32c(_CHECK[0][:5])) != _CHECK[1]:
    raise ImportError(f"kvpool: the {BACKEND} CRC-32C binding gives wrong results")
