"""Issue 18, item 6: evald started from the training folder creates nothing there, even when its model
factory imports a framework (MindFormers) that writes ``./output/log`` on import.

The factory is tests/log_writing_factory.py, a stand-in that creates its log directory exactly as
MindFormers does ($LOG_MF_PATH, else ./output/log), because the project's .venv has no MindFormers
(tests/e2e/test_mindformers_recipe.py runs the real one, in .venv-mindformers).
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests import faults
from tests.harness import REPO


def test_a_factory_that_logs_on_import_writes_beside_evalds_state_not_in_the_trainers_folder(tmp_path):
    train = tmp_path / "train"
    ckpt = train / "ckpt"
    faults.commit(ckpt, 10)
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO), EVALD_SOCKET_DIR=str(tmp_path / "sock"))
    env.pop("LOG_MF_PATH", None)
    out = subprocess.run([sys.executable, "-m", "evald", "--ckpt-dir", str(ckpt), "--endpoint", "none",
                          "--model-factory", "tests.log_writing_factory:build_model",
                          "--model-kwargs", f'{{"seq_len": {faults.SEQ_LEN}}}',
                          "--data-factory", "examples.tiny_lm.data:validation_windows",
                          "--data-kwargs", f'{{"seq_len": {faults.SEQ_LEN}}}', "--app-dir", str(REPO),
                          "--subset-size", "16", "--batch-size", "16", "--generation", '{"prompts": 0}',
                          "--idle-exit-s", "2"],
                         cwd=train, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    # nothing but the checkpoints and evald's own log directory (its documented default, CKPT_DIR/../tensorboard)
    assert sorted(p.name for p in train.iterdir()) == ["ckpt", "tensorboard"]
    assert (train / "tensorboard" / "mindformers-log").is_dir()        # beside evald's run directories
