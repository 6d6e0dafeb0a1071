"""Hostile inputs for evald's tests (issue 12): bait outside the checkpoint directory, code that
must never run, processes of another user, generated frames, and the audit log of a real evald.

* ``Bait``: a directory beside the checkpoint directory holding what an attacker would point
  evald at: a RUN.json naming ``os:system``, an importable ``evil.py`` that leaves a marker, a
  committed checkpoint, and a 651-byte "secret" (the size /etc/shadow had in the issue).
* ``as_other_user``: run a function in a forked child that has switched to uid/gid 65534
  (nobody); a real process of another user (needs root; tests skip otherwise).
* ``frames``: seeded, generated ZeroMQ frames: raw bytes, mutated valid messages, and valid
  envelopes whose fields come from pools of hostile values (paths out of the directory,
  other runs, 10**30 steps, NaN, factories that run commands, deep nesting).
* ``Audit``: the file accesses recorded by tests/audited_evald.py.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from evald.contracts import layout, wire
from tests import faults

OTHER_UID = 65534
SECRET_BYTES = 651


def is_root() -> bool:
    return os.getuid() == 0


@dataclass
class Bait:
    root: Path
    marker: Path        # created if any hostile code ran

    @classmethod
    def make(cls, tmp: Path) -> "Bait":
        root = Path(tmp) / "bait"
        root.mkdir()
        marker = Path(tmp) / "CODE-RAN"
        (root / "secret").write_bytes(b"s" * SECRET_BYTES)
        (root / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n"
                                      f"def build(**kwargs):\n    return 0\n")
        bait = cls(root, marker)
        layout.write_run_file(root, wire.RunAnnounced(
            run_id="bait", ckpt_dir=str(root), model_factory=bait.system_factory(),
            data_factory=bait.system_factory()).encode().decode())
        faults.commit(root, 1, run_id="bait")
        return bait

    def system_factory(self) -> wire.FactorySpec:
        return wire.FactorySpec("os:system", {"command": f"touch {self.marker}"}, str(self.root))

    def evil_factory(self) -> wire.FactorySpec:
        return wire.FactorySpec("evil:build", {}, str(self.root))

    def untouched(self) -> bool:
        """Nothing created in the bait directory, no run of it in a log directory beside it, no code ran."""
        from evald.daemon.run_dir import find_run

        return (not self.marker.exists() and find_run(self.root, self.root.parent / "tensorboard") is None
                and sorted(p.name for p in self.root.iterdir()) == sorted(
                    ["secret", "evil.py", layout.RUN_FILE, layout.step_dir_name(1)]))


def as_other_user(fn: Callable[[], None], timeout: float = 60.0) -> int:
    """Run ``fn`` in a forked child running as uid/gid 65534; its exit code (0 when fn returned)."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no exceptions out of here
        code = 1
        try:
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            fn()
            code = 0
        except BaseException as exc:
            sys.stderr.write(f"other-user child failed: {exc!r}\n")
        finally:
            os._exit(code)
    deadline = time.time() + timeout
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"the other user's process did not finish in {timeout}s")


def push_as_other_user(endpoint: str, frames: list[bytes], linger_s: float = 2.0) -> int:
    """Send ``frames`` on a PUSH socket from a process of another user."""
    def send() -> None:
        import zmq

        context = zmq.Context()
        sock = context.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, int(linger_s * 1000))
        sock.connect(endpoint)
        for frame in frames:
            sock.send(frame)
        time.sleep(linger_s)
        sock.close()
        context.term()
    return as_other_user(send)


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ================================================================ generated frames

def _pools(ckpt: Path, bait: Bait, run_id: str) -> dict[str, tuple[list, list]]:
    """Per kind of field: (values a decoder accepts but that mean harm, values it must refuse)."""
    entries = [e.name for e in os.scandir(ckpt)] if ckpt.exists() else []
    return {
        "run_id": ([run_id, run_id, run_id, "other-run", "bait", "x" * 256, "\u202e-rtl"],
                   ["", "x" * 300, "a\x00b", "a\nb", 5, None]),
        "ckpt_dir": ([str(ckpt), str(ckpt), str(ckpt), str(bait.root), "/", "/etc", "..", f"{ckpt}/..",
                      f"{ckpt}/evald", "relative/dir", f"{ckpt}/../bait"],
                     ["", "x" * 5000, f"{ckpt}\n", None, 7]),
        "path": (["step_000000001", "step_000000099", layout.RUN_FILE, layout.RUN_END_FILE, "evald",
                  layout.MANIFEST_FILE, "a" * 255, "bait", "secret-1_1.ckpt", *entries],
                 ["..", ".", "../bait", "/etc/passwd", "a" * 300, "\x01", "x/y", None]),
        "step": ([0, 1, 7, 19, 2**63 - 1, 2**62], [2**63, -1, 10**30, 1.5, "5", True, None, float("nan")]),
        "factory": ([bait.system_factory().__dict__, bait.evil_factory().__dict__, "os:system", "evil:build",
                     {"target": "builtins:exec", "kwargs": {"source": f"open({str(bait.marker)!r},'w')"}},
                     {"target": "os:system", "search_path": "/tmp"}, None],
                    [{"target": 5}, "no-colon", {"kwargs": {}}, {"target": "a:b", "kwargs": [1]}]),
        "task": (["lm", "classification", "evil"], ["", None, 3]),
        "text": (["", "completed", "\u202e", "x" * 4096], ["x" * 5000, "\x00", None, 1.0]),
        "number": ([0, 1.7e9, -1, 1e308, 2**63 - 1], [2**64, float("nan"), float("inf"), "now", None, True]),
        "endpoint": (["tcp://0.0.0.0:1", "ipc:///tmp/x"], ["", None]),
    }


def _pick(rng: random.Random, pools: dict, kind: str, valid: bool):
    good, bad = pools[kind]
    return rng.choice(good if valid or rng.random() < 0.7 else bad)


_FIELDS = {
    "run_announced": {"run_id": "run_id", "ckpt_dir": "ckpt_dir", "task": "task", "model_factory": "factory",
                      "data_factory": "factory", "total_steps": "step", "every_n_steps": "step",
                      "world_size": "step", "control_endpoint": "endpoint"},
    "checkpoint_committed": {"run_id": "run_id", "ckpt_dir": "ckpt_dir", "step": "step", "path": "path",
                             "commit_time": "number"},
    "run_finished": {"run_id": "run_id", "ckpt_dir": "ckpt_dir", "final_step": "step", "reason": "text"},
    "control_state": {"run_id": "run_id", "seq": "step", "stop_at_step": "step", "reason": "text"},
    "train_metrics": {"run_id": "run_id"},
}


def _records(rng: random.Random, pools: dict, valid: bool) -> list:
    records = []
    for _ in range(rng.choice([0, 1, 10, 50])):
        scalars = {rng.choice(["loss", "grad_norm", "learning_rate", "x" * 256, "x" * 300, ""]):
                   rng.choice([1.0, "nan", "inf", "-inf", 1e308, -5, "x", None, 2**64])
                   for _ in range(rng.randint(0, 4))}
        records.append({"step": _pick(rng, pools, "step", valid), "wall_time": _pick(rng, pools, "number", valid),
                        "scalars": scalars})
    return records


def _envelope(rng: random.Random, pools: dict) -> dict:
    """Half the time every field is one the decoder accepts (so it reaches evald's logic)."""
    valid = rng.random() < 0.5
    kind = rng.choice(list(_FIELDS) + ([] if valid else ["unknown"]))
    data: dict = {"v": 1 if valid or rng.random() < 0.8 else rng.choice([2, True, "1", 1.0]), "type": kind,
                  "sent_at": _pick(rng, pools, "number", valid)}
    for name, pool in _FIELDS.get(kind, {}).items():
        if valid or rng.random() < 0.9:
            data[name] = _pick(rng, pools, pool, valid)
    if kind == "train_metrics":
        data["records"] = _records(rng, pools, valid)
    if rng.random() < 0.1:
        data[rng.choice(["extra", "__proto__", "v"] if not valid else ["extra"])] = "x"
    return data


def _encode(rng: random.Random, data: dict) -> bytes:
    text = json.dumps(data, allow_nan=True, default=str)
    return text.encode("utf-8", "surrogatepass")


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        how = rng.random()
        if how < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif how < 0.7 and data:
            del data[rng.randrange(len(data)):]
        else:
            data[rng.randrange(len(data) + 1):0] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(data)


def _odd(rng: random.Random) -> bytes:
    return rng.choice([
        b"[" * 100_000 + b"]" * 100_000, b'{"v":1,"type":"run_finished","final_step":' + b"9" * 5000 + b"}",
        b'{"v":1,"type":"checkpoint_committed","step":1e400}', b"\xff\xfe" * 1000, b"", b"null",
        b'{"v":1,"type":"train_metrics","run_id":"r","records":[' + b'{"step":1},' * 5000 + b'{}]}',
        b'"' + b"\\" * 10000, b"{" * 20 + b"}" * 20,
    ])


def frames(seed: int, count: int, ckpt: Path, bait: Bait, run_id: str,
           valid_metrics: Callable[[int], wire.Message] | None = None) -> Iterator[bytes]:
    """``count`` generated frames: 55% hostile envelopes, 15% mutated ones, 15% random bytes,
    10% valid train_metrics of the real run (``valid_metrics(i)``), 5% odd shapes."""
    rng = random.Random(seed)
    pools = _pools(ckpt, bait, run_id)
    for i in range(count):
        roll = rng.random()
        if roll < 0.55:
            yield _encode(rng, _envelope(rng, pools))
        elif roll < 0.70:
            yield _mutate(rng, _encode(rng, _envelope(rng, pools)))
        elif roll < 0.85:
            yield bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 7, 64, 1000])))
        elif roll < 0.95 and valid_metrics is not None:
            yield valid_metrics(i).encode()
        else:
            yield _odd(rng)


def raw_garbage(ipc_path: str, seed: int, connections: int) -> int:
    """Connect to an ipc socket as a plain Unix socket (no ZeroMQ) and send random bytes."""
    rng = random.Random(seed)
    sent = 0
    for _ in range(connections):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            try:
                s.connect(ipc_path)
                s.sendall(bytes(rng.randrange(256) for _ in range(rng.choice([1, 10, 100, 4096]))))
                sent += 1
            except OSError:
                pass  # evald hung up on the garbage: that is the point
    return sent


# ================================================================ the audit log

@dataclass(frozen=True)
class Access:
    event: str
    path: str
    detail: str

    @property
    def writes(self) -> bool:
        return self.event != "open" and self.event not in ("os.listdir", "os.scandir", "sqlite3.connect") or (
            self.event == "open" and self.detail == "write")


class Audit:
    """The lines tests/audited_evald.py wrote: file accesses, thread lists, sys.path at exit."""

    def __init__(self, path: Path) -> None:
        self.accesses: list[Access] = []
        self.threads: list[set[str]] = []
        self.sys_path: list[str] | None = None
        for line in Path(path).read_text(errors="replace").splitlines():
            event, _, rest = line.partition("\t")
            value, _, detail = rest.partition("\t")
            if event == "threads":
                self.threads.append(set(value.split(",")))
            elif event == "sys.path":
                self.sys_path = value.split(os.pathsep)
            else:
                self.accesses.append(Access(event, value, detail))

    def under(self, root: Path) -> list[Access]:
        root_text = str(root).rstrip("/")
        return [a for a in self.accesses
                if a.path == root_text or a.path.startswith(root_text + "/") or a.detail.startswith(f"to {root_text}")]

    def outside(self, roots: list[Path], writes: bool) -> list[Access]:
        """Accesses (only writes, or all) whose path lies under none of ``roots``."""
        texts = [str(r).rstrip("/") for r in roots]

        def inside(path: str) -> bool:
            return any(path == t or path.startswith(t + "/") for t in texts)

        return [a for a in self.accesses if (a.writes or not writes) and a.event != "subprocess.Popen"
                and not (inside(a.path) and (a.event != "os.rename" or inside(a.detail[len("to "):])))]

    def processes(self) -> list[str]:
        """Every process evald started (os.system, subprocess, exec, spawn, fork)."""
        return [f"{a.event} {a.path}" for a in self.accesses
                if a.event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork")]
