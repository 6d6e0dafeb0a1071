"""Fault injection for evald's reliability tests (issue 3): real files, real processes.

In-process helpers (numpy, safetensors, sqlite, zmq only; no mindspore):

* ``demo_weights`` / ``weights_for_step``: host arrays with the demo model's
  real names and shapes (made once by a subprocess, cached as .npz), so evald
  can evaluate checkpoints committed without any training.
* ``announce`` / ``commit``: RUN.json and evald-layout checkpoints.
* ``demo_suite_config``: evald's resolved configuration for the demo model with one small benchmark suite.
* ``start`` (evald with small, fast settings), ``ledger_rows``, ``tb_texts``,
  ``event_file_records`` (CRC-checked TFRecord walk: is the last record whole?),
  ``rss_kb``, ``Pusher``/``push`` (real wire messages over a ZeroMQ PUSH socket).
* corruption helpers: ``truncate``, ``flip_bit``, ``overwrite_garbage``;
  ``save_ckpts``: MindSpore ``.ckpt`` files (optionally prefixed, with optimizer
  state, with or without ``step_num``) written by ``mindspore.save_checkpoint``.

Subprocess entry points (``python -m tests.faults COMMAND ...``):

* ``dump-weights OUT.npz``: the demo model's initial weights.
* ``writer``: a "trainer" that commits checkpoints in a loop with a pause
  before each commit, so a SIGKILL often lands mid-write (orphaned temp dirs).
* ``foreign-train``: a real ``Model.train`` run of the demo model whose only
  checkpointing is MindSpore's own ``ModelCheckpoint`` (optimizer state
  included); optionally also evald-layout reference checkpoints of the same
  network weights at ``step + ref_offset``, to prove what evald evaluated.
* ``save-ckpts SPEC.json``: the files ``save_ckpts`` describes (one mindspore import).
* ``slow-copy``: copy a file in place in two halves with a pause between
  (a foreign writer that does not use temp + rename).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from evald.contracts import layout, wire  # noqa: E402
from tests.harness import PYTHON, Proc, base_env, event_files, ledger_tag, run_dir, start_evald  # noqa: E402

if TYPE_CHECKING:
    from evald.config import ResolvedConfig

SEQ_LEN = 64
MODEL_FACTORY = wire.FactorySpec("examples.tiny_lm.model:build_model", {"seq_len": SEQ_LEN}, str(REPO))
DATA_FACTORY = wire.FactorySpec("examples.tiny_lm.data:validation_windows", {"seq_len": SEQ_LEN}, str(REPO))
# Small and fast evaluations (2 batches); tests that need slow ones override these.
FAST = ("--subset-size", "32", "--batch-size", "16", "--generation", '{"prompts": 0}')


# ================================================================ weights and checkpoints

def _weights_cache() -> Path:
    digest = hashlib.sha256((REPO / "examples" / "tiny_lm" / "model.py").read_bytes()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"evald-faults-{os.getuid()}-tiny_lm-{digest}.npz"


_WEIGHTS: dict[str, np.ndarray] | None = None


def demo_weights() -> dict[str, np.ndarray]:
    """The demo model's initial weights (real names and shapes), built once in a subprocess."""
    global _WEIGHTS
    if _WEIGHTS is None:
        path = _weights_cache()
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.npz")
            subprocess.run([PYTHON, "-m", "tests.faults", "dump-weights", str(tmp)], env=base_env(),
                           cwd=str(REPO), check=True, timeout=300, capture_output=True)
            os.replace(tmp, path)
        with np.load(path) as data:
            _WEIGHTS = {name: data[name] for name in data.files}
    return dict(_WEIGHTS)


def weights_for_step(step: int, base: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Distinct, deterministic weights per step: the initial weights plus small seeded noise."""
    base = base or demo_weights()
    rng = np.random.default_rng(step)
    return {name: (a + 0.02 * rng.standard_normal(a.shape)).astype(a.dtype) for name, a in base.items()}


def announce(ckpt_dir: Path, run_id: str = "faults") -> Path:
    """RUN.json, so that evald knows the model and data factories (no trainer needed)."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    message = wire.RunAnnounced(run_id=run_id, ckpt_dir=str(ckpt_dir), model_factory=MODEL_FACTORY,
                                data_factory=DATA_FACTORY)
    return layout.write_run_file(ckpt_dir, message.encode().decode())


def commit(ckpt_dir: Path, step: int, weights: dict[str, np.ndarray] | None = None, *,
           run_id: str = "faults", before_commit=None) -> Path:
    return layout.write_checkpoint(Path(ckpt_dir), step, weights if weights is not None else weights_for_step(step),
                                   run_id=run_id, before_commit=before_commit)


def weights_path(ckpt_dir: Path, step: int) -> Path:
    return Path(ckpt_dir) / layout.step_dir_name(step) / layout.WEIGHTS_FILE


# ================================================================ configuration

def demo_suite_config(tmp: Path) -> "ResolvedConfig":
    """evald's configuration, as ``parse_config`` resolves it, for the demo model and data factories with one
    suite ``mc`` (8 documents of the demo's ``stdlib_next_line`` task, written under TMP/bench) and
    small evaluations (16 windows, no generation); TMP/evald.toml is its config file."""
    from evald.cli.main import parse_config
    from examples.tiny_lm.benchmarks import write_benchmarks

    include = write_benchmarks(Path(tmp) / "bench", next_line_count=24, bpb_docs_per_set=1)
    config = Path(tmp) / "evald.toml"
    config.write_text('tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"\nsubset_size = 16\n'
                      'batch_size = 16\n[generation]\nprompts = 0\n'
                      f'[suites.mc]\ninclude_path = [{json.dumps(include)}]\ntasks = ["stdlib_next_line"]\n'
                      'limit = 8\nbatch_size = 4\n')
    return parse_config(["--config", str(config), "--model-factory", MODEL_FACTORY.target,
                         "--model-kwargs", json.dumps(dict(MODEL_FACTORY.kwargs)),
                         "--data-factory", DATA_FACTORY.target,
                         "--data-kwargs", json.dumps(dict(DATA_FACTORY.kwargs))], environ={})


# ================================================================ corruption

def truncate(path: Path, keep_fraction: float = 0.5) -> None:
    path = Path(path)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.truncate(int(path.stat().st_size * keep_fraction))


def flip_bit(path: Path, offset: int | None = None) -> None:
    """Flip one bit in the middle of the file (size unchanged)."""
    path = Path(path)
    os.chmod(path, 0o644)
    size = path.stat().st_size
    offset = size // 2 if offset is None else offset
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def overwrite_garbage(path: Path, size: int | None = None, seed: int = 0) -> None:
    path = Path(path)
    if path.exists():
        os.chmod(path, 0o644)
        size = path.stat().st_size if size is None else size
    data = np.random.default_rng(seed).integers(0, 256, size or 4096, dtype=np.uint8).tobytes()
    path.write_bytes(data)


# ================================================================ evald and its outputs

def start(tmp: Path, ckpt_dir: Path | None, *args: str, env: dict[str, str] | None = None,
          name: str = "evald", zmq: bool = False, fast: bool = True) -> Proc:
    """A real ``python -m evald`` (not pinned to a core: the machine is shared)."""
    cmd: list[str] = [*(FAST if fast else ()), *(["--ckpt-dir", str(ckpt_dir)] if ckpt_dir else [])]
    if not zmq:
        cmd += ["--endpoint", "none"]
    return start_evald(Path(tmp), env or {}, [*cmd, *args], name=name, cpu=None)


def ledger_path(ckpt_dir: Path, logdir: Path | None = None) -> Path:
    """The ledger of ``ckpt_dir``'s run in ``logdir`` (evald's --logdir; default CKPT_DIR/../tensorboard)."""
    return run_dir(ckpt_dir, logdir) / "ledger.sqlite"


def ledger_rows(ckpt_dir: Path, logdir: Path | None = None) -> list[dict[str, Any]]:
    """Every row of the ledger's ``steps`` table, one per step (an empty list before evald made it).

    ``key`` is the file the step is read from and ``source`` how it was found (zmq, watchdog, rescan).
    """
    return _query(ckpt_dir, logdir, "SELECT step, state, source AS key, kind, found_via AS source, reason,"
                                    " attempts, run_id, commit_time, metrics, admitted_at AS seen_at, started_at, finished_at"
                                    " FROM steps ORDER BY step")


def ledger_files(ckpt_dir: Path, logdir: Path | None = None) -> dict[str, dict[str, Any]]:
    """The ledger's ``files`` table: every entry evald judged, by name (used, duplicate, rejected)."""
    rows = _query(ckpt_dir, logdir, "SELECT name, step, status, reason FROM files ORDER BY name")
    return {r["name"]: r for r in rows}


def _query(ckpt_dir: Path, logdir: Path | None, sql: str) -> list[dict[str, Any]]:
    path = ledger_path(ckpt_dir, logdir)
    if not path.exists():
        return []
    db = sqlite3.connect(path, timeout=30)
    try:
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute(sql)]
        except sqlite3.OperationalError:  # evald has not created the schema yet
            return []
    finally:
        db.close()


def ledger_by_key(ckpt_dir: Path, logdir: Path | None = None) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in ledger_rows(ckpt_dir, logdir)}


def ledger_states(ckpt_dir: Path, logdir: Path | None = None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in ledger_rows(ckpt_dir, logdir):
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return counts


def tb_texts(run: Path, prefix: str = "evald/") -> list[tuple[int, str, str]]:
    """(step, ledger tag, text) of every text summary of a run directory whose tag starts with ``prefix``, read raw."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    found = []
    for sub_run, path in event_files(run):
        for raw in RawEventFileLoader(str(path)).Load():
            event = event_pb2.Event.FromString(raw)
            for value in event.summary.value:
                tag = ledger_tag(sub_run, value.tag.removesuffix("/text_summary"))
                if tag.startswith(prefix) and value.HasField("tensor") and value.tensor.string_val:
                    found.append((event.step, tag, value.tensor.string_val[0].decode("utf-8", "replace")))
    return found


def event_file_records(path: Path) -> tuple[int, int]:
    """(records, trailing bytes) of a TFRecord event file, every length and data CRC checked.

    A writer that was closed cleanly leaves 0 trailing bytes; a torn last record shows as
    trailing bytes (or a CRC mismatch, which raises)."""
    import struct

    from tensorboardX.record_writer import masked_crc32c

    data = Path(path).read_bytes()
    offset = records = 0
    while len(data) - offset >= 12:
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if header_crc != masked_crc32c(header) or offset + 16 + length > len(data):
            break
        payload = data[offset + 12:offset + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[offset + 12 + length:offset + 16 + length])
        if payload_crc != masked_crc32c(payload):
            raise ValueError(f"{path}: record {records} has a bad CRC")
        offset += 16 + length
        records += 1
    return records, len(data) - offset


def scalar_tags(run: Path) -> list[str]:
    """The ledger names of every scalar tag of a run directory (both sub-runs), via EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for sub_run in ("eval", "train"):
        if not (Path(run) / sub_run).is_dir():
            continue
        acc = EventAccumulator(str(Path(run) / sub_run), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        tags.update(ledger_tag(sub_run, tag) for tag in acc.Tags().get("scalars", []))
    return sorted(tags)


def rss_kb(pid: int) -> int:
    """Resident set size of a process, from /proc/PID/status (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Pusher:
    """A ZeroMQ PUSH socket connected to evald's endpoint, sending real wire messages."""

    def __init__(self, endpoint: str, linger_ms: int = 5000) -> None:
        import zmq

        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, 1_000_000)
        self._socket.setsockopt(zmq.LINGER, linger_ms)
        self._socket.connect(endpoint)

    def send(self, messages: Iterable[wire.Message]) -> int:
        sent = 0
        for message in messages:
            self._socket.send(message.encode())
            sent += 1
        return sent

    def close(self) -> None:
        self._socket.close()
        self._context.term()

    def __enter__(self) -> "Pusher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def push(endpoint: str, messages: Iterable[wire.Message], linger_ms: int = 5000) -> int:
    """Send real wire messages over a ZeroMQ PUSH socket connected to evald's endpoint."""
    with Pusher(endpoint, linger_ms) as pusher:
        return pusher.send(messages)


def committed_notice(ckpt_dir: Path, step: int, run_id: str = "faults") -> wire.CheckpointCommitted:
    return wire.CheckpointCommitted(run_id=run_id, ckpt_dir=str(ckpt_dir), step=step,
                                    path=layout.step_dir_name(step), commit_time=time.time())


def temp_dirs(ckpt_dir: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(ckpt_dir) if layout.TEMP_DIR_PATTERN.match(e.name))


def log_count(proc: Proc, text: str) -> int:
    return proc.output().count(text)


# ================================================================ subprocess entry points

def _dump_weights(out: str) -> None:
    from examples.tiny_lm.model import build_model
    from trainer_hooks.host_copy import host_copy_of_weights

    np.savez(out, **host_copy_of_weights(build_model(seq_len=SEQ_LEN)))


def _writer(args: argparse.Namespace) -> None:
    """Commit checkpoints first_step, first_step+every, ... pausing inside each write; with --hold-at N, the write
    of the N-th (from 0) never commits: it waits before its rename until the process is killed (mid-write whenever
    the kill comes, however slowly the killer runs)."""
    with np.load(args.weights) as data:
        base = {name: data[name] for name in data.files}
    rng = random.Random(args.seed)
    step = args.first_step
    for index in range(args.count):
        pause = rng.uniform(0, args.pause_before_commit)

        def before_commit(_tmp: Path, held: bool = index == args.hold_at, pause: float = pause) -> None:
            while held:
                time.sleep(1)
            time.sleep(pause)

        path = layout.write_checkpoint(Path(args.ckpt_dir), step, weights_for_step(step, base),
                                       run_id=args.run_id, before_commit=before_commit)
        print(f"committed {step} {path.name}", flush=True)
        step += args.every
        time.sleep(args.interval)


def _foreign_train(args: argparse.Namespace) -> None:
    """``Model.train`` of the demo model checkpointed by MindSpore's own ModelCheckpoint only."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Callback, CheckpointConfig, Model, ModelCheckpoint

    from examples.tiny_lm import data, model as model_mod
    from trainer_hooks.host_copy import host_copy_of_weights

    ms.set_context(mode=ms.GRAPH_MODE)
    net = model_mod.build_model(seq_len=SEQ_LEN, seed=args.seed)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=3e-3, weight_decay=0.01)
    windows = data.training_windows(args.steps_per_epoch * 16, SEQ_LEN, seed=args.seed)
    dataset = ds.NumpySlicesDataset({"window": windows}, shuffle=False).batch(16, drop_remainder=True)
    config = CheckpointConfig(save_checkpoint_steps=args.save_steps, keep_checkpoint_max=1000,
                              append_info=["step_num"] if args.append_step else None)
    callbacks: list[Any] = [ModelCheckpoint(prefix=args.prefix, directory=args.ckpt_dir, config=config)]

    class Reference(Callback):
        """evald-layout copies of the same network weights, at step + ref_offset."""

        def on_train_step_end(self, run_context):
            cb = run_context.original_args()
            if cb.cur_step_num % args.save_steps == 0:
                layout.write_checkpoint(Path(args.ref_dir), cb.cur_step_num + args.ref_offset,
                                        host_copy_of_weights(net), run_id="reference")

    class Pace(Callback):
        def on_train_step_end(self, run_context):
            time.sleep(args.step_sleep)

    if args.ref_dir:
        callbacks.append(Reference())
    if args.step_sleep:
        callbacks.append(Pace())
    Model(model_mod.LMLoss(net), optimizer=optimizer).train(args.epochs, dataset, callbacks=callbacks,
                                                             dataset_sink_mode=False)
    print("foreign training finished", flush=True)


def _save_ckpts(args: argparse.Namespace) -> None:
    """MindSpore ``.ckpt`` files (``save_checkpoint``) from a JSON list of
    ``{"path", "seed", "step_num": int|null, "prefix": "", "moments": bool}``: the weights are
    ``weights_for_step(seed)`` under ``prefix``; ``moments`` adds Adam-like optimizer state
    (``adam_m.``/``adam_v.`` + name) and a ``global_step``, as ``Model.train`` saves them."""
    import mindspore as ms

    with np.load(args.weights) as data:
        base = {name: data[name] for name in data.files}
    for spec in json.loads(Path(args.spec).read_text()):
        weights = weights_for_step(int(spec["seed"]), base)
        prefix = spec.get("prefix", "")
        params = [{"name": prefix + name, "data": ms.Tensor(array)} for name, array in weights.items()]
        if spec.get("moments"):
            rng = np.random.default_rng(0)
            params.append({"name": "global_step", "data": ms.Tensor(np.array([7], np.int32))})
            for state in ("adam_m.", "adam_v."):
                params.extend({"name": state + prefix + name,
                               "data": ms.Tensor((1e-3 * rng.standard_normal(a.shape)).astype(a.dtype))}
                              for name, a in weights.items())
        append = {"step_num": int(spec["step_num"])} if spec.get("step_num") is not None else None
        ms.save_checkpoint(params, spec["path"], append_dict=append)
        print(f"saved {spec['path']}", flush=True)


def save_ckpts(specs: list[dict[str, Any]], work_dir: Path) -> None:
    """Write MindSpore .ckpt files (one subprocess, one mindspore import); see ``_save_ckpts``."""
    demo_weights()
    spec_path = Path(work_dir) / f"ckpt-specs-{time.time_ns()}.json"
    spec_path.write_text(json.dumps(specs))
    subprocess.run([PYTHON, "-m", "tests.faults", "save-ckpts", str(spec_path), "--weights",
                    str(_weights_cache())], env=base_env(), cwd=str(REPO), check=True, timeout=300)


def _slow_copy(args: argparse.Namespace) -> None:
    """Write ``dst`` in place (no temp name): first half, fsync, pause, rest."""
    data = Path(args.src).read_bytes()
    half = len(data) // 2
    with open(args.dst, "wb") as f:
        f.write(data[:half])
        f.flush()
        os.fsync(f.fileno())
        print(f"half written {time.time():.6f}", flush=True)
        time.sleep(args.pause)
        f.write(data[half:])
        f.flush()
        os.fsync(f.fileno())
    print(f"complete {time.time():.6f}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("dump-weights")
    p.add_argument("out")
    p = sub.add_parser("writer")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--first-step", type=int, required=True)
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--pause-before-commit", type=float, default=0.2)
    p.add_argument("--hold-at", type=int, default=None, metavar="N",
                   help="the N-th write (from 0) waits before its commit until the process is killed")
    p.add_argument("--interval", type=float, default=0.0)
    p.add_argument("--run-id", default="faults")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("foreign-train")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--prefix", default="tinylm")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=6)
    p.add_argument("--save-steps", type=int, default=3)
    p.add_argument("--append-step", action="store_true")
    p.add_argument("--ref-dir", default=None)
    p.add_argument("--ref-offset", type=int, default=1000)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("save-ckpts")
    p.add_argument("spec")
    p.add_argument("--weights", required=True)
    p = sub.add_parser("slow-copy")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--pause", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.command == "dump-weights":
        _dump_weights(args.out)
    elif args.command == "writer":
        _writer(args)
    elif args.command == "foreign-train":
        _foreign_train(args)
    elif args.command == "save-ckpts":
        _save_ckpts(args)
    elif args.command == "slow-copy":
        _slow_copy(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
