"""``evald --device 4,5,6,7``: one evaluation on several devices, as an msrun group.

    evald --device 0,1 [options]             one host: one eval rank per device
    evald --device 4,5,6,7 --group '{"nodes": 2, "node_rank": 0, "master_addr": "10.0.0.1", "master_port": 8119,
                                     "key_file": "/etc/evald/group.key"}'
                                             node 0 of two hosts; run the same with node_rank 1 on the other

This process (the launcher) starts msrun, MindSpore's own launcher, which starts its
scheduler and one worker per device, each running ``python -m evald`` with the same
arguments. A worker takes device ``ids[local rank]`` and joins the group with
``mindspore.communication.init()``. Rank 0 (node 0, first device) is a complete evald:
it binds the sockets, keeps the ledger, TensorBoard and the decisions, and gives the
other ranks their commands (evald.pipeline.group.evaluator). The other ranks only evaluate.

Signals: the launcher passes SIGTERM/SIGINT on to the workers. Rank 0 handles them as a
one-device evald does (the first finishes the current evaluation, then the group exits;
the second abandons it); the other ranks and the scheduler ignore them and end when rank 0
ends the group. A third signal kills the whole group. If any rank dies, msrun ends the
others; the step under way was never committed, so it is evaluated again at the next start.

msrun's own traffic is unauthenticated, so the launcher gives its ranks the group's secret in their
environment (a fresh one each start on one host; ``group.key_file`` over several hosts), and every
command and answer of the group carries its tag (evald.pipeline.group.protocol).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from evald.contracts.auth import SecurityError, load_group_key
from evald.contracts.outside_paths import OutsidePathError, resolve
from evald.daemon.run_dir import RunDirError
from evald.config import ResolvedConfig
from evald.config.schema import parse_cpus

log = logging.getLogger("evald.group")

ENV_WORKER = "EVALD_GROUP_WORKER"            # set by the launcher: this process is a worker (or scheduler)
ENV_EXIT_FILE = "EVALD_GROUP_EXIT_FILE"      # where rank 0 leaves its exit code for the launcher
ENV_GROUP_KEY = "EVALD_GROUP_KEY"            # the group's secret (hex), from the launcher to its ranks only
WATCH_INTERVAL_S = 0.05                       # how often the launcher checks that the known eval ranks live
SCAN_INTERVAL_S = 1.0                         # how often it looks for eval ranks it has not seen yet
DEFAULT_COMM_TIMEOUT_S = "600"               # CPU collectives otherwise fail after 30 s of waiting
MSRUN = "import sys; from mindspore.parallel.cluster.run import main; sys.argv[0] = 'msrun'; sys.exit(main())"


def main(resolved: ResolvedConfig, argv: Sequence[str]) -> int:
    if os.environ.get(ENV_WORKER):
        return worker(resolved)
    return launch(resolved, argv)


# --- the launcher ------------------------------------------------------------------------------

def log_dir_of(resolved: ResolvedConfig) -> Path:
    """msrun's logs: group.log_dir, else LOGDIR/msrun-RUN_NAME beside the run's TensorBoard directory."""
    from evald.daemon.run_dir import default_logdir, default_run_name, resolved_ckpt_dir

    config = resolved.config
    if config.group.log_dir:
        return Path(config.group.log_dir)
    if not config.ckpt_dir and not config.logdir:
        return Path("evald-msrun")
    ckpt_dir = resolved_ckpt_dir(config.ckpt_dir) if config.ckpt_dir else None
    logdir = Path(config.logdir) if config.logdir else default_logdir(ckpt_dir)  # type: ignore[arg-type]
    name = config.run_name or (default_run_name(ckpt_dir) if ckpt_dir else "evald")
    return logdir / f"msrun-{name}"


def msrun_command(resolved: ResolvedConfig, argv: Sequence[str], log_dir: Path, port: int) -> list[str]:
    """msrun's command line for this host of the group: workers run ``python -P -m evald ARGV``.

    ``-P``: the workers start in the caller's directory, and ``-m`` would put that directory first on
    ``sys.path``, so a folder named ``evald`` there (the checkout, seen from its parent) would shadow
    the installed package in every rank."""
    config, group = resolved.config, resolved.config.group
    local = len(config.device.ids)
    cmd = [sys.executable, "-P", "-c", MSRUN, f"--worker_num={local * group.nodes}", f"--local_worker_num={local}",
           f"--master_addr={group.master_addr}", f"--master_port={port}", f"--log_dir={log_dir}", "--join=True",
           f"--cluster_time_out={group.cluster_time_out}", f"--tail_worker_log={group.node_rank * local}"]
    if group.nodes > 1:
        cmd.append(f"--node_rank={group.node_rank}")  # ranks node_rank*local.. : rank 0 is node 0's first device
    return cmd + ["python", "-P", "-m", "evald", *argv]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _python_first_on_path(log_dir: Path, env: dict[str, str]) -> None:
    """msrun starts workers as ``python`` from PATH: make that this interpreter."""
    here = Path(sys.executable).parent
    candidate = here / "python"
    if candidate.exists() and os.path.samefile(candidate, sys.executable):
        bin_dir = here
    else:
        bin_dir = log_dir / ".bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        wrapper = bin_dir / "python"
        wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
        wrapper.chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"


def launch(resolved: ResolvedConfig, argv: Sequence[str]) -> int:
    """Run this host's part of the group under msrun; return rank 0's exit code (1 if the group failed)."""
    from evald.daemon import logs

    logs.configure(resolved.config.log_level, resolved.config.log_format)
    config = resolved.config
    try:
        log_dir = resolve(log_dir_of(resolved), "the eval group's log directory (group.log_dir)")
    except (OutsidePathError, RunDirError) as exc:  # a link loop, a path too long: a clear error, exit 2
        logging.getLogger("evald").error("%s", exc)
        return 2
    try:
        key = group_key(config.group.key_file)
    except SecurityError as exc:
        logging.getLogger("evald").error("%s", exc)
        return 2
    log_dir.mkdir(parents=True, exist_ok=True)
    exit_file = log_dir / "rank0.exit"
    exit_file.unlink(missing_ok=True)
    env = dict(os.environ, **{ENV_WORKER: "1", ENV_EXIT_FILE: str(exit_file), ENV_GROUP_KEY: key.hex()})
    env.setdefault("MS_CPU_COMM_OP_TIMEOUT", DEFAULT_COMM_TIMEOUT_S)
    _python_first_on_path(log_dir, env)
    port = config.group.master_port or _free_port()
    cmd = msrun_command(resolved, argv, log_dir, port)
    log.info("eval group: %d rank(s) on devices %s of this host (node %d of %d); msrun's logs in %s",
             len(config.device.ids), config.device, config.group.node_rank, config.group.nodes, log_dir)
    msrun = subprocess.Popen(cmd, env=env, start_new_session=True)  # a terminal's Ctrl-C reaches us, not msrun
    signals = _Forwarder(msrun)
    rc = signals.wait()
    code = _rank0_code(exit_file) if config.group.node_rank == 0 else None
    if code is None:
        code = 0 if rc == 0 else 1
        if rc != 0:
            first = signals.first_gone
            which = (f"eval rank {first[0]} (pid {first[1]}, log worker_{first[0]}.log) ended first, then msrun "
                     f"ended the others" if first is not None else "a rank failed or died")
            log.error("the eval group ended with an error (msrun exit %s): %s; a rank failed or died; see %s. "
                      "A step under way was not recorded and is evaluated again at the next start%s", rc, which,
                      log_dir, "".join(f"\n  {name}: {text}" for name, text in first_errors(log_dir)))
    return code


def group_key(key_file: str | None) -> bytes:
    """The group's secret: ``group.key_file``'s (the same on every host), else a fresh one for this start
    (a group on one host: only this launcher's ranks get it). SecurityError for an unusable key file."""
    if key_file:
        return load_group_key(key_file)
    import secrets

    return secrets.token_bytes(32)


def worker_key(environ: dict[str, str]) -> bytes:
    """The group's secret the launcher put in this rank's environment, taken out of it (children of the
    rank need not see it); SecurityError when a rank was started without one."""
    text = environ.pop(ENV_GROUP_KEY, "")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        raise SecurityError(f"this eval rank has no group key in {ENV_GROUP_KEY}: start eval groups with "
                            f"`evald --device a,b,...`, whose launcher gives every rank the group's secret")
    return key


def first_errors(log_dir: Path, lines: int = 6) -> list[tuple[str, str]]:
    """The first lines of each rank's error (from its worker log), so that a dead rank says why here."""
    found = []
    for path in sorted(log_dir.glob("worker_*.log")):
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for at, line in enumerate(text):
            if line.startswith("Traceback") or "Error:" in line:
                end = next((i for i in range(at, len(text)) if "Error" in text[i] and ":" in text[i]
                            and not text[i].startswith(" ")), at)
                shown = text[at:at + lines] + ([text[end]] if end >= at + lines else [])
                found.append((path.name, "\n    ".join(s.rstrip() for s in shown)))
                break
    return found


def _rank0_code(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class WorkerProcess:
    """A process under msrun that has a worker's command line and environment."""
    pid: int
    parent: int
    rank: int


def eval_ranks(found: Sequence[WorkerProcess]) -> dict[int, tuple[int, int]]:
    """pid -> (rank, pid) of the eval ranks among ``found``: those whose parent is not one of them. A rank's
    own child is not a rank: MindSpore runs ``sh -c "cat /proc/cpuinfo ..."``, and between fork and exec the
    child has its parent's command line and environment; counted as a rank, its end named the wrong rank
    (rank 0) as the first that ended."""
    pids = {process.pid for process in found}
    return {process.pid: (process.rank, process.pid) for process in found if process.parent not in pids}


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` has ended: gone, or a zombie its parent (msrun) has not reaped yet. One read
    of /proc/PID/stat, cheap enough for every WATCH_INTERVAL_S: msrun ends the other ranks about half a
    second after one dies, so the launcher must see the first one end before they do."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


def first_gone(seen: dict[int, tuple[int, int]], alive: dict[int, tuple[int, int]],
               already: tuple[int, int] | None) -> tuple[int, int] | None:
    """The (rank, pid) of the first eval rank that ended: ``already`` if known, else the lowest rank among
    those seen before and not alive now (several at once: the one polling saw go first cannot be told)."""
    if already is not None:
        return already
    gone = sorted(v for pid, v in seen.items() if pid not in alive)
    return gone[0] if gone else None


class _Forwarder:
    """Passes SIGTERM/SIGINT to the group's workers; the third signal kills the whole group."""

    def __init__(self, msrun: subprocess.Popen) -> None:
        self.msrun, self.count = msrun, 0
        self.ranks_seen: dict[int, tuple[int, int]] = {}  # pid -> (rank, pid) of every eval rank seen alive
        self.first_gone: tuple[int, int] | None = None    # (rank, pid) of the first eval rank that ended
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _workers(self, all_processes: bool = False) -> list:
        import psutil

        found = []
        try:
            children = psutil.Process(self.msrun.pid).children(recursive=True)
        except psutil.Error:
            return found
        for child in children:
            try:
                if all_processes or ("evald" in child.cmdline() and child.environ().get("MS_ROLE") == "MS_WORKER"):
                    found.append(child)
            except psutil.Error:
                continue
        return found

    def _handle(self, signum: int, _frame: object) -> None:
        self.count += 1
        if self.count >= 3:
            log.warning("third signal: killing the eval group")
            for process in self._workers(all_processes=True):
                process.kill()
            self.msrun.kill()
            return
        log.warning("signal %d: passing it to the eval ranks (rank 0 decides; a third signal kills the group)", signum)
        for process in self._workers():
            process.send_signal(signal.SIGTERM)

    def wait(self) -> int:
        """msrun's exit code; meanwhile, which eval rank ended first (``first_gone``: msrun ends the others
        once one has failed, so the first to go is the one that failed or was killed). The ranks are looked
        for every SCAN_INTERVAL_S (a walk of msrun's process tree) and each known one checked every
        WATCH_INTERVAL_S; only the check decides that a rank ended (a failed read of a live process's
        environment in a scan must not look like its end)."""
        scanned = float("-inf")
        while True:
            try:
                rc = self.msrun.wait(timeout=WATCH_INTERVAL_S)
            except subprocess.TimeoutExpired:
                if time.monotonic() - scanned >= SCAN_INTERVAL_S:
                    self._scan_ranks()
                    scanned = time.monotonic()
                self._check_ranks()
                continue
            except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
                continue
            self._check_ranks()
            return rc

    def _scan_ranks(self) -> None:
        """Note the eval ranks not seen before."""
        found = []
        for process in self._workers():
            try:
                found.append(WorkerProcess(process.pid, process.ppid(), int(process.environ().get("RANK_ID", ""))))
            except Exception:
                continue
        for pid, rank in eval_ranks(found).items():
            if pid not in self.ranks_seen and not process_ended(pid):
                self.ranks_seen[pid] = rank

    def _check_ranks(self) -> None:
        alive = {pid: rank for pid, rank in self.ranks_seen.items() if not process_ended(pid)}
        self.first_gone = first_gone(self.ranks_seen, alive, self.first_gone)


# --- a worker (or msrun's scheduler) -----------------------------------------------------------

def _cores_for(text: str, local: int, count: int) -> set[int]:
    """This local rank's share of --cpu-affinity: the cores split evenly, in order."""
    cores = sorted(parse_cpus(text))
    share = max(1, len(cores) // count)
    mine = cores[local * share:(local + 1) * share]
    return set(mine or [cores[local % len(cores)]])


def worker(resolved: ResolvedConfig) -> int:
    config = resolved.config
    role, local = os.environ.get("MS_ROLE"), int(os.environ.get("DEVICE_ID", "0"))  # msrun: DEVICE_ID = local rank
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # rank 0 ends the group; its Server takes these over
    if config.cpu_affinity:
        cores = (parse_cpus(config.cpu_affinity) if role == "MS_SCHED"
                 else _cores_for(config.cpu_affinity, local, len(config.device.ids)))
        os.sched_setaffinity(0, cores)  # before mindspore starts its threads
    from mindspore.communication import get_group_size, get_rank, init

    try:
        key = worker_key(os.environ)
    except SecurityError as exc:
        logging.getLogger("evald").error("%s", exc)
        return 2
    if role == "MS_SCHED":
        init()  # the scheduler serves the group inside init
        return 0
    from evald.pipeline.device import select_device

    select_device(config.device.target, config.device.ids[local])
    init()
    rank, size = get_rank(), get_group_size()
    from evald.daemon import logs

    logs.configure(config.log_level, config.log_format)
    if config.log_format == "text":  # say which rank speaks (msrun's logs are per rank anyway)
        for handler in logging.getLogger().handlers:
            handler.setFormatter(logging.Formatter(logs.TEXT_FORMAT.replace("%(name)s", f"rank{rank} %(name)s")))
    from evald.pipeline.group.protocol import Group

    group = Group(rank, size, key=key)
    if rank != 0:
        log.info("eval rank %d of %d on device %d: waiting for rank 0's commands", rank, size, config.device.ids[local])
        from evald.pipeline.group.evaluator import follow

        return follow(group)
    from evald.daemon.server import Server

    log.info("eval rank 0 of %d on device %d: this rank keeps the ledger, the sockets and the decisions", size,
             config.device.ids[local])
    code = Server(resolved, group=group).serve()
    exit_file = os.environ.get(ENV_EXIT_FILE)
    if exit_file:
        Path(exit_file).write_text(f"{code}\n")
    return code
