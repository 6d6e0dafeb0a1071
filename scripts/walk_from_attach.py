"""How far the checkpoint directory travels when evald attaches to it: every evald function called (in
the main thread) from ``Server.attach`` until it returns, on a directory with a run file and two committed
checkpoints and no factories.

    .venv/bin/python scripts/walk_from_attach.py [CHECKOUT] [-v]

CHECKOUT (default: this repository) is the tree whose ``evald`` is traced, so an older commit can be
measured beside this one (``git worktree add /tmp/old <commit>``). Prints, for every call and for the
calls given the checkpoint directory (or a path in it) as an argument, the stops (distinct evald functions
called, comprehensions and lambdas left out), the files they are in, and how many times evald code
outside the ledger package calls into it; ``-v`` lists the stops. The walk includes building the network from the run file's
factories (``Run.prepare``). Issue 25 counted the same by hand, by reading (65 stops, 25
files, 9 ledger entries); numbers from this script compare with each other, not with that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _prepare(ckpt: Path) -> None:
    """The directory, written by this repository's test helpers in a separate process."""
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); from pathlib import Path; from tests import faults; "
            f"d = Path({str(ckpt)!r}); faults.announce(d); faults.commit(d, 10); faults.commit(d, 20)")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "GLOG_v": "3"})


def _arity(code) -> int:
    return code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)


def _names_directory(value: object, ckpt: Path) -> bool:
    """Whether an argument is the checkpoint directory, or a path in it (as a Path or a str)."""
    if isinstance(value, (str, Path)):
        try:
            text = os.fspath(value)
        except TypeError:
            return False
        return text == str(ckpt) or text.startswith(str(ckpt) + os.sep)
    return False


def _trace(checkout: Path, ckpt: Path, logdir: Path, sockets: Path) -> list[tuple[str, str, str, bool]]:
    sys.path.insert(0, str(checkout))
    import evald

    package = str(Path(evald.__file__).resolve().parent) + os.sep
    assert package.startswith(str(checkout.resolve())), f"evald comes from {package}, not {checkout}"
    calls: list[tuple[str, str, str]] = []
    root = []

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call":
            if not root:
                if code.co_name == "attach" and code.co_filename.endswith(os.path.join("daemon", "server.py")):
                    root.append(frame)
                return
            if code.co_filename.startswith(package) and not code.co_name.startswith("<"):
                caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
                arguments = [frame.f_locals.get(name) for name in code.co_varnames[:_arity(code)]]
                carries = any(_names_directory(value, ckpt) for value in arguments)
                calls.append((caller, code.co_filename, getattr(code, "co_qualname", code.co_name), carries))
        elif event == "return" and root and frame is root[0]:
            sys.setprofile(None)

    os.environ.update({"EVALD_ENDPOINT": f"ipc://{sockets}/n.sock", "EVALD_CONTROL_ENDPOINT": f"ipc://{sockets}/c.sock",
                       "EVALD_SOCKET_DIR": str(sockets), "GLOG_v": "3"})
    from evald.cli.main import main

    sys.setprofile(profile)
    try:
        main(["--ckpt-dir", str(ckpt), "--logdir", str(logdir), "--idle-exit-s", "1"])
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    return calls


def main() -> None:
    given = [a for a in sys.argv[1:] if a != "-v"]
    checkout = Path(given[0]).resolve() if given else HERE
    with tempfile.TemporaryDirectory() as tmp:
        sockets = Path(tempfile.mkdtemp(prefix="walk-", dir="/tmp"))
        os.chmod(sockets, 0o700)
        _prepare(Path(tmp) / "ckpt")
        calls = _trace(checkout, Path(tmp) / "ckpt", Path(tmp) / "logs", sockets)
    package = os.sep + "evald" + os.sep
    ledger = os.sep + os.path.join("evald", "ledger") + os.sep
    for title, walk in (("every call", calls), ("calls given the directory or a path in it", [c for c in calls if c[3]])):
        stops = {(callee, name) for _, callee, name, _ in walk}
        files = {callee for callee, _ in stops}
        entries = sum(1 for caller, callee, _, _ in walk   # from evald code outside the ledger (not contextlib)
                      if ledger in callee and package in caller and ledger not in caller)
        print(f"{checkout}, {title}: {len(walk)} calls, {len(stops)} stops in {len(files)} files, "
              f"the ledger entered {entries} times")
        if "-v" in sys.argv:
            for path in sorted(files):
                names = sorted(n for f, n in stops if f == path)
                print(f"  {path.split(package, 1)[-1]}: {', '.join(names)}")


if __name__ == "__main__":
    main()
