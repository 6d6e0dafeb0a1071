"""Generated hostile checkpoint directories (issue 19): random trees of links, loops, sparse and
oversize files, FIFOs, hard links, wrong owners and modes, odd names, beside a bait directory
whose files evald must never read.

``Entry`` says what one entry of the tree is; ``build`` makes them in ``CKPT_DIR`` (the committed
checkpoints are real ones of the demo model, made by evald's own writer). ``ENTRIES`` is a
hypothesis strategy for the unit property test; ``SEEDED`` a few fixed trees for the e2e test.
"""

from __future__ import annotations

import dataclasses
import os
import random
from dataclasses import dataclass
from pathlib import Path

from evald.contracts import layout
from tests import faults

OTHER_UID = 12345
SPARSE_BYTES = 1 << 40   # 1 TiB, no disk used

KINDS = ("checkpoint", "sparse", "sparse_foreign", "bad_manifest", "manifest_link", "link_out", "link_dir_out",
         "loop", "self_loop", "link_sibling", "dev_zero", "hard_link_out", "fifo", "empty_foreign", "garbage_foreign")
NAMES = ("step_000000005", "step_000000006", "step_000000007", "step_\u0660\u0660\u0660\u0660\u0660\u0660\u0667\u0660\u0660",
         "step_000000008\n", "step_99999999999999999999999", "net-1_7.ckpt", "net-1_9.safetensors", "m-2_3.ckpt",
         "plain.ckpt", "step_000000009-part-00000-of-00002", "step_000000009-part-00001-of-00002",
         "with space", ".step_5.tmp-ab", os.fsdecode(b"step_00000001\xff"))
OWNERS = (None, OTHER_UID)
MODES = (None, 0o000, 0o777)


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    owner: int | None = None   # chown to this uid (another user), or leave evald's
    mode: int | None = None


def bait(tmp: Path) -> Path:
    """Files outside the checkpoint directory that evald must never read."""
    root = Path(tmp) / "bait"
    if not root.exists():
        root.mkdir()
        (root / "secret").write_bytes(b"s" * 651)
        faults.commit(root, 3)
    return root


def build(ckpt: Path, entries: list[Entry], outside: Path) -> list[str]:
    """Make ``entries`` in ``ckpt`` (the first of a name wins); the names made."""
    ckpt.mkdir(parents=True, exist_ok=True)
    made: list[str] = []
    for entry in entries:
        path = ckpt / entry.name
        if entry.name in made or os.path.lexists(path):
            continue
        _make(ckpt, path, entry.kind, outside, made)
        if entry.owner is not None:
            os.lchown(path, entry.owner, entry.owner)
        if entry.mode is not None and not os.path.islink(path):
            os.chmod(path, entry.mode)
        made.append(entry.name)
    return made


def _make(ckpt: Path, path: Path, kind: str, outside: Path, made: list[str]) -> None:
    if kind in ("checkpoint", "sparse", "bad_manifest", "manifest_link"):
        scratch = ckpt.parent / ".scratch"
        scratch.mkdir(exist_ok=True)
        step = layout.parse_step_dir_name(path.name)
        step = step if step is not None and step < 2**63 else 5  # an out-of-range name: another step's contents
        committed = faults.commit(scratch, step)
        os.chmod(committed, 0o755)
        manifest = committed / layout.MANIFEST_FILE
        manifest.chmod(0o644)
        if kind == "sparse":   # the manifest says 1 TiB and so does the file: a header covering a tiny part
            read = layout.read_manifest(committed)
            [spec] = read.files
            os.chmod(committed / spec.name, 0o644)
            os.truncate(committed / spec.name, SPARSE_BYTES)
            manifest.write_text(dataclasses.replace(read, files=(dataclasses.replace(spec, bytes=SPARSE_BYTES),)).to_json())
        elif kind == "bad_manifest":
            manifest.write_text('{"layout_version": 2, "step": [[[[[[[[[[]]]]]]]]]]')
        elif kind == "manifest_link":
            manifest.unlink()
            os.symlink(outside / "secret", manifest)
        os.rename(committed, path)
    elif kind == "sparse_foreign":
        with open(path, "wb") as f:
            f.truncate(SPARSE_BYTES)
    elif kind == "link_out":
        os.symlink(outside / "secret", path)
    elif kind == "link_dir_out":
        os.symlink(outside / layout.step_dir_name(3), path)
    elif kind == "loop":
        os.symlink(str(path) + ".b", path)
        if not os.path.lexists(str(path) + ".b"):
            os.symlink(path, str(path) + ".b")
    elif kind == "self_loop":
        os.symlink(path, path)
    elif kind == "link_sibling":
        os.symlink(made[0] if made else "nothing-here", path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "hard_link_out":
        os.link(outside / "secret", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "empty_foreign":
        path.write_bytes(b"")
    elif kind == "garbage_foreign":
        path.write_bytes(os.urandom(4096))


def seeded(seed: int, count: int = 12) -> list[Entry]:
    """A fixed random tree (the e2e test's few examples)."""
    rng = random.Random(seed)
    return [Entry(rng.choice(NAMES), rng.choice(KINDS), rng.choice(OWNERS), rng.choice(MODES)) for _ in range(count)]


def entries_strategy():
    from hypothesis import strategies as st

    return st.lists(st.builds(Entry, st.sampled_from(NAMES), st.sampled_from(KINDS), st.sampled_from(OWNERS),
                              st.sampled_from(MODES)), min_size=1, max_size=10)
