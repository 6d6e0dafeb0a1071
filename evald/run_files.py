"""The trainer's own records beside its checkpoints: RUN.json (the run and its factories) and
RUN_END.json (the end of the run), read and validated with the wire contract.

The trust rule for code (docs/security.md): only a RUN.json that evald's own user owns and
nobody else can write may name the factories evald imports; from any other file they are
refused, and the log names what was refused.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evald.contracts import layout
from evald.contracts.wire import ProtocolError, RunAnnounced, RunFinished, announcement_from_json, decode

log = logging.getLogger("evald")


@dataclass(frozen=True)
class Announcement:
    message: RunAnnounced
    options: dict[str, Any]   # what it may fill in the configuration (evald.config.ANNOUNCED)
    where: str


def read_announcement(ckpt_dir: Path) -> Announcement | None:
    """RUN.json as options for the configuration; None when absent or invalid (logged)."""
    path = ckpt_dir / layout.RUN_FILE
    text = layout.read_run_file(ckpt_dir)
    if text is None:
        return None
    where = f"run announcement {path}"
    try:
        message = announcement_from_json(text)
    except ProtocolError as exc:
        log.error("%s is not usable: %s", where, exc)
        return None
    options: dict[str, Any] = {"task": message.task}
    distrust = untrusted(path)
    for which in ("model", "data"):
        spec = getattr(message, f"{which}_factory")
        if spec is None:
            continue
        if distrust:
            log.error("%s names the %s factory %s (search path %s), but %s: not imported; give evald "
                      "--%s-factory itself", where, which, spec.target, spec.search_path, distrust, which)
            continue
        options.update({f"{which}_factory": spec.target, f"{which}_kwargs": dict(spec.kwargs)})
        options["app_dir"] = options.get("app_dir") or spec.search_path
    return Announcement(message, options, where)


def read_run_end(ckpt_dir: Path) -> RunFinished | None:
    """RUN_END.json; None when absent or invalid (logged)."""
    text = layout.read_run_file(ckpt_dir, layout.RUN_END_FILE)
    if text is None:
        return None
    try:
        message = decode(text.encode())
    except ProtocolError as exc:
        log.error("%s is not usable: %s", ckpt_dir / layout.RUN_END_FILE, exc)
        return None
    return message if isinstance(message, RunFinished) else None


def untrusted(path: Path) -> str | None:
    """Why code named by this file must not be run, or None when it may be."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})"
    if st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by evald's uid {os.getuid()}"
    if st.st_mode & 0o022:
        return f"others can write it (mode {oct(st.st_mode & 0o777)})"
    return None
