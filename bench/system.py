"""What machine a run was on: date, kernel, CPU model, cores, memory and load."""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
from pathlib import Path
from typing import Any

import psutil


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first `model name` in `cpuinfo`, else `platform.processor()`, else "unknown"."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def uname_srm() -> str:
    """What `uname -srm` prints: kernel name, kernel release and machine."""
    info = os.uname()
    return f"{info.sysname} {info.release} {info.machine}"


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded: other work on the machine skews a run."""
    return [round(value, 2) for value in os.getloadavg()]


def system_info() -> dict[str, Any]:
    """The date (UTC, ISO 8601), uname -srm, CPU model, logical and physical cores, Python,
    memory, and the load average when the run starts."""
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "uname": uname_srm(),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": sys.version.split()[0],
        "load_average_start": load_average(),
    }
