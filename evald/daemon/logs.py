"""evald's log lines: for people (``--log-format text``, the default) or for log shippers (``json``).

``json`` writes one JSON object per line: ``time`` (ISO 8601, UTC), ``level``,
``logger``, ``message`` and the structured fields a log call passes with
``extra=`` (``step``, ``key`` the checkpoint entry, ``state``, ``reason``, durations
in seconds ``load_s``/``evaluate_s``/``lag_s``, metrics...), plus ``exception`` with
the traceback when there is one. A field that JSON cannot hold is written as text.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str, allow_nan=True)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Send evald's log to stderr in ``fmt`` (text or json), replacing any handler set before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.captureWarnings(True)  # Python warnings in the same format
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level))
