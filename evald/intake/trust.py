"""The trust rule: who may name the code evald imports, and the directory it serves.

A run announcement names factories (``module:function``) that evald imports and
calls, so naming them is running code as evald's user. evald accepts them only from
a source that only evald's own user (or root) controls (docs/security.md):

* a **local socket** (``ipc://``) in a directory owned by evald's user that nobody
  else can write to (``ensure_socket_dir`` refuses to bind anywhere else);
* an **authenticated peer**: a network channel with CURVE and an allow-list of
  trainer keys (docs/authentication.md); a plaintext TCP channel is never trusted;
* a **RUN.json** owned by evald's user and not writable by group or others, judged
  on the very file that was read (evald.contracts.small_files).

The same rule decides whether the first message may pick the directory evald serves.
Everything refused is logged with its source and what it named.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evald.contracts.wire_fields import preview
from evald.files.ownership import why_untrusted

log = logging.getLogger("evald.intake.trust")


@dataclass(frozen=True)
class Source:
    """Where something came from, and whether it may name code or the served directory."""

    name: str                 # "notification endpoint ipc:///tmp/evald-0/notify.sock", "RUN.json /x/RUN.json"
    trusted: bool
    why: str                  # why it is (not) trusted, for the log

    def __str__(self) -> str:
        return f"{self.name} ({self.why})"


def channel(endpoint: str, *, authenticated: bool = False) -> Source:
    """The notification channel bound at ``endpoint``; ``authenticated``: CURVE with an allow-list."""
    name = f"notification endpoint {endpoint}"
    if authenticated:
        return Source(name, True, "every peer is authenticated by CURVE against the allow-list")
    if endpoint.startswith("inproc://"):
        return Source(name, True, "inside this process")
    if endpoint.startswith("ipc://"):
        directory = Path(endpoint[len("ipc://"):]).parent
        why = private_directory(directory)
        if why is None:
            return Source(name, True, f"a local socket in {directory}, private to uid {os.getuid()}")
        return Source(name, False, why)
    return Source(name, False, "a network endpoint without CURVE authentication: anyone who can reach it can send")


def of_receiver(receiver: Any) -> Source:
    """The trust of the messages a ``Receiver`` hands on (all from one bound channel)."""
    if receiver is None:
        return Source("no notification endpoint", False, "no channel")
    return channel(receiver.endpoint, authenticated=bool(getattr(receiver, "authenticated", False)))  # CURVE


def of_message(receiver: Any, peer_trusted: bool) -> Source:
    """The trust of one message: its channel's, never more than its peer's (the receiver tags each one)."""
    origin = of_receiver(receiver)
    if peer_trusted or not origin.trusted:
        return origin
    return Source(origin.name, False, "a peer this channel did not authenticate")


def private_directory(directory: Path) -> str | None:
    """None when ``directory`` is a real directory of evald's uid (or root's) that others cannot write."""
    try:
        info = os.lstat(directory)
    except OSError as exc:
        return f"{directory} cannot be examined ({exc.strerror})"
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory"
    return why_untrusted(info, str(directory))   # the one rule for what names code (evald.files.ownership)


def run_file(path: Path, info: os.stat_result) -> Source:
    """A RUN.json, judged on the ``stat`` of the file descriptor it was read from."""
    why = why_untrusted(info, str(path))   # the one rule for whatever names code (evald.files.ownership)
    name = f"run announcement {path}"
    if why is None:
        return Source(name, True, f"owned by evald's uid {os.getuid()}, writable by no one else")
    return Source(name, False, why)


REFUSAL_LOG_INTERVAL_S = 10.0
_refusals: dict[tuple, tuple[float, int]] = {}   # (source, what) -> (last logged, refusals not logged since)


def _should_log(key: tuple) -> str | None:
    """A suffix for the log line when it is due (one per key every 10 s: a flood cannot fill the disk)."""
    now = time.monotonic()
    last, unlogged = _refusals.get(key, (float("-inf"), 0))
    if now - last < REFUSAL_LOG_INTERVAL_S:
        _refusals[key] = (last, unlogged + 1)
        return None
    _refusals[key] = (now, 0)
    return f" [{unlogged} more refused since the last report]" if unlogged else ""


def refuse_factory(source: Source, which: str, spec: Any, instead: str) -> None:
    """Log a factory that was NOT imported because of its source."""
    suffix = _should_log((source.name, which))
    if suffix is None:
        return
    log.error("refused the %s factory %s (kwargs %s, search path %s) named by %s: only evald's operator, a "
              "RUN.json of evald's own user that nobody else can write, a private local socket or an "
              "authenticated peer may name code evald imports (docs/security.md); %s%s",
              which, preview(spec.target, 600), preview(dict(spec.kwargs), 300), preview(spec.search_path, 300),
              source, instead, suffix)


def may_attach(source: Source, ckpt_dir: str, message_type: str) -> bool:
    """Whether a message from ``source`` may choose the directory an evald started without one serves."""
    if source.trusted:
        return True
    suffix = _should_log((source.name, "attach"))
    if suffix is not None:
        log.error("refused to serve %s, named by a %s message from %s: an untrusted message never chooses the "
                  "directory evald serves; start evald with --ckpt-dir, or use a private local socket%s",
                  preview(ckpt_dir, 300), message_type, source, suffix)
    return False
