"""The trainer's own records beside its checkpoints: RUN.json (the run and its factories) and
RUN_END.json (the end of the run), read and validated with the wire contract.

The trust rule for code (evald.intake.trust, docs/security.md): only a RUN.json that evald's own
user owns and nobody else can write may name the factories evald imports, judged on the
file that was read; when it may not, a run_announced message of the same run from a
trusted channel may. Anything else is refused, and the log names what was refused. Both
files are read bounded, never through a link, never from a FIFO or device.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evald.config import ResolvedConfig
from evald.contracts import layout, small_files
from evald.contracts.wire import ProtocolError, RunAnnounced, RunFinished, announcement_from_json, decode
from evald.intake import trust

log = logging.getLogger("evald")


@dataclass(frozen=True)
class Announcement:
    message: RunAnnounced
    options: dict[str, Any]   # what it may fill in the configuration (evald.config.ANNOUNCED)
    where: str


def read_announcement(ckpt_dir: Path, message: RunAnnounced | None = None,
                      channel: trust.Source | None = None, *, operator: ResolvedConfig | None = None
                      ) -> Announcement | None:
    """RUN.json as options for the configuration; None when absent or invalid (logged).

    ``message``: the newest run_announced from ``channel``; it may name the factories RUN.json
    may not (a RUN.json others can write, e.g. under umask 002), if the channel is trusted and
    it announces the same run. ``operator``: what the operator configured, so that the log says
    what happens to an announced factory (used, not used, refused) once, not at every re-read.
    """
    path = ckpt_dir / layout.RUN_FILE
    where = f"run announcement {path}"
    read = _read(path)
    if read is None:
        return None
    try:
        announced = announcement_from_json(read[0])
    except ProtocolError as exc:
        log.error("%s is not usable: %s", where, exc)
        return None
    source = trust.run_file(path, read[1])
    options: dict[str, Any] = {"task": announced.task}
    for which in ("model", "data"):
        spec, origin = getattr(announced, f"{which}_factory"), source
        backup = getattr(message, f"{which}_factory", None) if message and message.run_id == announced.run_id else None
        if channel is not None and channel.trusted and backup is not None and (spec is None or not source.trusted):
            spec, origin = backup, channel
        if spec is None:
            continue
        if not origin.trusted:
            trust.refuse_factory(origin, which, spec, f"not imported; give evald --{which}-factory itself")
            continue
        _say_once(which, spec, origin, channel, operator)
        options.update({f"{which}_factory": spec.target, f"{which}_kwargs": dict(spec.kwargs)})
        options["app_dir"] = options.get("app_dir") or spec.search_path
    return Announcement(announced, options, where)


REPEAT_SAID_EVERY_S = 3600.0
_said: dict[tuple, tuple[float, int]] = {}   # (which, target, origin, verdict) -> (last said, times since)


def _say_once(which: str, spec: Any, origin: trust.Source, channel: trust.Source | None,
              operator: ResolvedConfig | None) -> None:
    """Log what becomes of an announced factory: once, then at most hourly with the count (RUN.json is
    re-read at every rescan; the same line every 30 s would say nothing new)."""
    flag = f"--{which}-factory"
    if operator is not None and operator.set_by_operator(f"{which}_factory"):
        verdict = (f"the {which} factory {spec.target} announced by {origin.name} is not used: the operator's "
                   f"{flag} {getattr(operator.config, f'{which}_factory')} is")
    elif operator is not None and _refused_by_allow(spec, operator.config.factory_allow):
        verdict = (f"refused the {which} factory {spec.target} announced by {origin.name}: its module is not "
                   f"under --factory-allow {','.join(operator.config.factory_allow)}; nothing is imported")
    elif origin is channel:
        verdict = f"the {which} factory {spec.target} comes from the run_announced message on {channel}"
    else:
        return
    key = (which, spec.target, origin.name, verdict)
    now = time.monotonic()
    last, since = _said.get(key, (float("-inf"), 0))
    if now - last < REPEAT_SAID_EVERY_S:
        _said[key] = (last, since + 1)
        return
    _said[key] = (now, 0)
    log.info("%s%s", verdict, f" (said {since} more times since the last report)" if since else "")


def _refused_by_allow(spec: Any, allow: tuple) -> bool:
    """The rule of evald.pipeline.factories.check_allowed (which refuses it at build time; intake may
    not import the pipeline), only to word the log line."""
    module = spec.target.partition(":")[0]
    return bool(allow) and not any(module == p.rstrip(".") or module.startswith(p.rstrip(".") + ".") for p in allow)


def read_run_end(ckpt_dir: Path) -> RunFinished | None:
    """RUN_END.json; None when absent or invalid (logged)."""
    read = _read(ckpt_dir / layout.RUN_END_FILE)
    if read is None:
        return None
    text = read[0]
    try:
        message = decode(text.encode())
    except ProtocolError as exc:
        log.error("%s is not usable: %s", ckpt_dir / layout.RUN_END_FILE, exc)
        return None
    return message if isinstance(message, RunFinished) else None


def may_name_factories(message: RunAnnounced, channel: trust.Source) -> bool:
    """Whether a run_announced message from ``channel`` may name factories; logs what it named when not."""
    if channel.trusted:
        return True
    for which in ("model", "data"):
        spec = getattr(message, f"{which}_factory")
        if spec is not None:
            trust.refuse_factory(channel, which, spec, "ignored; RUN.json and the operator decide")
    return False


class Changes:
    """Whether a file changed (inode, mtime, size, and ctime: a chmod or chown changes whether it is
    trusted) since the last call: a flood of messages that name another run, or a rescan, re-reads nothing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: tuple | None = ()

    def __call__(self) -> bool:
        try:
            info = os.lstat(self.path)
            key: tuple | None = (info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size)
        except OSError:
            key = None
        changed, self._key = key != self._key, key
        return changed


def _read(path: Path) -> tuple[str, os.stat_result] | None:
    """The text of a small file the trainer writes and the stat of what was read; None when absent
    or unusable (a link, a FIFO, a device, too big, not UTF-8: logged)."""
    try:
        data, info = small_files.read_regular(path, small_files.MAX_RUN_FILE_BYTES)
        return data.decode("utf-8"), info
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("%s is not usable: %s", path, exc)
        return None
