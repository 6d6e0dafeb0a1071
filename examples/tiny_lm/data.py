"""Text that ships with every Python install: the standard library's own sources, as bytes.

``validation_windows`` is the eval-data factory evald calls
(``examples.tiny_lm.data:validation_windows``): an int32 array (N, seq_len + 1)
of non-overlapping windows from the held-out tail of the corpus.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np

# A fixed list, so every machine with the same Python gets the same corpus.
_CORPUS_MODULES = (
    "argparse.py", "collections/__init__.py", "dataclasses.py", "functools.py", "inspect.py",
    "json/decoder.py", "json/encoder.py", "logging/__init__.py", "pathlib.py", "pickle.py",
    "queue.py", "random.py", "shutil.py", "string.py", "subprocess.py", "tarfile.py",
    "textwrap.py", "threading.py", "typing.py", "zipfile.py" if os.path.exists(
        Path(sysconfig.get_paths()["stdlib"]) / "zipfile.py") else "zipfile/__init__.py",
)
VALIDATION_FRACTION = 0.05


def corpus_bytes() -> np.ndarray:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks = []
    for name in _CORPUS_MODULES:
        path = stdlib / name
        if path.exists():
            chunks.append(path.read_bytes())
    if not chunks:
        raise FileNotFoundError(f"no standard-library sources found under {stdlib}")
    return np.frombuffer(b"\n".join(chunks), dtype=np.uint8)


def split(corpus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cut = int(len(corpus) * (1 - VALIDATION_FRACTION))
    return corpus[:cut], corpus[cut:]


def training_windows(num_windows: int, seq_len: int = 64, seed: int = 0) -> np.ndarray:
    """Random windows (num_windows, seq_len + 1) from the training part, seeded."""
    train, _ = split(corpus_bytes())
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(train) - seq_len - 1, size=num_windows)
    return np.stack([train[s:s + seq_len + 1] for s in starts]).astype(np.int32)


def validation_windows(seq_len: int = 64) -> np.ndarray:
    """All non-overlapping windows (N, seq_len + 1) of the held-out part."""
    _, valid = split(corpus_bytes())
    n = (len(valid) - 1) // seq_len
    return np.stack([valid[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)]).astype(np.int32)
