"""The checkpoint I/O paths as they were before layout version 2 (commit 1337672), kept only so
that bench/scale.py can measure "before" and "after" side by side in one run.

* commit: ``safetensors.numpy.save_file`` + fsync, then the whole file read back for sha256,
  then the manifest (layout version 1), rename;
* evald: sha256 of the whole file (one read), ``safetensors.numpy.load_file`` (a second read,
  into new arrays), new ``Tensor``/``Parameter`` objects (a copy), ``load_param_into_net``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from evald.contracts import layout


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_checkpoint_v1(ckpt_dir: Path, step: int, weights: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    final = Path(ckpt_dir) / layout.step_dir_name(step)
    tmp = Path(ckpt_dir) / f".{final.name}.tmp-0legacy"
    tmp.mkdir(parents=True)
    try:
        path = tmp / "weights.safetensors"
        arrays = {name: np.ascontiguousarray(arr) for name, arr in weights.items()}
        save_file(arrays, str(path))
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        manifest = {"layout_version": 1, "run_id": "bench", "step": step, "epoch": None,
                    "commit_time": time.time(), "weights_file": path.name,
                    "weights_bytes": path.stat().st_size, "weights_sha256": sha256_of_file(path),
                    "params": [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype)} for n, a in arrays.items()],
                    "resume": {}, "producer": {}}
        with open(tmp / layout.MANIFEST_FILE, "w") as f:
            f.write(json.dumps(manifest))
            f.flush()
            os.fsync(f.fileno())
        layout.fsync_dir(tmp)
        os.rename(tmp, final)
        layout.fsync_dir(Path(ckpt_dir))
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_and_swap_v1(step_dir: Path, network) -> None:
    import mindspore as ms
    from safetensors.numpy import load_file

    manifest = json.loads((step_dir / layout.MANIFEST_FILE).read_text())
    path = step_dir / manifest["weights_file"]
    if path.stat().st_size != manifest["weights_bytes"] or sha256_of_file(path) != manifest["weights_sha256"]:
        raise RuntimeError(f"{path}: verification failed")
    weights = load_file(str(path))
    named = dict(network.parameters_and_names())
    params = {named[n].name: ms.Parameter(ms.Tensor(np.ascontiguousarray(a), named[n].dtype), name=named[n].name)
              for n, a in weights.items()}
    not_loaded, unused = ms.load_param_into_net(network, params, strict_load=True)
    if not_loaded or unused:
        raise RuntimeError(f"load_param_into_net left {not_loaded} unloaded and {unused} unused")
