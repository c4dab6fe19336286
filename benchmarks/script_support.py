"""What the benchmark scripts share: the host their measured (CPU) figures were measured on,
recorded beside each figure, and the check that an output path can be written before a
long run starts."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` reports (often
    only the architecture, e.g. x86_64)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    """The host's logical CPUs."""
    return os.cpu_count() or 1


def output_path_error(flag: str, value: str, folder: bool = False) -> str | None:
    """Why ``value`` (given as ``flag``) cannot be written, or None: a file ``folder`` (or
    a folder as a file) already there, or a file where one of its parent folders would be
    made. Checked before a run, so a long run does not end in a traceback."""
    path = Path(value)
    if path.exists() and path.is_dir() != folder:
        return f"{flag} {value}: a {'file' if folder else 'folder'} is already there"
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                return f"{flag} {value}: {parent} is a file, not a folder"
            break
    return None
