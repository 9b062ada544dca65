"""Building small, valid wheels in memory, for tests that install packages in a sandbox."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile


def tiny_wheel(value: str = "installed") -> bytes:
    """A wheel of the package `corraltiny` 1.0, whose module sets `VALUE = value`."""
    files = {
        "corraltiny/__init__.py": f"VALUE = {value!r}\n".encode(),
        "corraltiny-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: corraltiny\n"
        b"Version: 1.0\n",
        "corraltiny-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("corraltiny-1.0.dist-info/RECORD,,")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("corraltiny-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return buffer.getvalue()
