"""Keep the frameworks that a factory imports from filling evald's log with their INFO lines.

MindFormers logs through a logger of its own (``mindformers.tools.logger.get_logger``): a stdout
handler at INFO and files under ``LOG_MF_PATH``, not propagated to the root logger, so evald's
``--log-level`` does not reach it. Building one LLaMA writes 14 INFO lines into evald's log
(recompute plans, "MoE config is None", ...). Once a factory's module is imported, its stdout handler
is raised to WARNING: its warnings and errors stay in evald's log, and every line, INFO included,
stays in its own files, which evald points beside its state (``cli.main.keep_framework_logs_out_of_cwd``).
With ``--log-level DEBUG`` nothing is changed.

May import: the standard library only. MindFormers is never imported here: only a logger module that
the factory's import already loaded is used.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("evald.pipeline.framework_logs")

MINDFORMERS_LOGGER_MODULE = "mindformers.tools.logger"


def quiet_framework_stdout() -> list[str]:
    """Raise the stdout handlers of the frameworks already imported to WARNING; the names of the
    loggers changed (none when no such framework is loaded, or evald itself logs at DEBUG)."""
    if logging.getLogger("evald").getEffectiveLevel() <= logging.DEBUG:
        return []
    module = sys.modules.get(MINDFORMERS_LOGGER_MODULE)
    get_logger = getattr(module, "get_logger", None)
    if get_logger is None:
        return []
    try:
        framework_logger = get_logger()  # MindFormers creates it on first use, with its handlers
    except Exception as exc:  # noqa: BLE001 - its logger is theirs; evald's start must not depend on it
        log.debug("could not reach MindFormers' logger to quiet it: %r", exc)
        return []
    changed = False
    for handler in framework_logger.handlers:
        is_console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if is_console and handler.level < logging.WARNING:
            handler.setLevel(logging.WARNING)
            changed = True
    if not changed:
        return []
    files = [getattr(h, "baseFilename", None) for h in framework_logger.handlers]
    log.info("MindFormers' INFO lines go to its own log files (%s), not here; its warnings and errors "
             "still do (--log-level DEBUG keeps them all here)", ", ".join(f for f in files if f) or "none")
    return [framework_logger.name]
