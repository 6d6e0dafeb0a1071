"""A real evald evaluating a classification model: every metric equals scikit-learn's on the
same predictions, and a Metric plug-in named on the command line is reported."""

from __future__ import annotations

import numpy as np
import pytest

from evald.contracts import layout, wire
from tests.harness import REPO, run_dir, scalar_points, start_evald


def test_classification_metrics_match_sklearn(tmp_path, endpoints, procs):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    import mindspore as ms

    from examples.tiny_cls import data, model
    from trainer_hooks.host_copy import host_copy_of_weights

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    net = model.build_model(seed=3)
    weights = host_copy_of_weights(net)
    layout.write_checkpoint(ckpt, 7, weights, run_id="cls")
    layout.write_run_file(ckpt, wire.RunAnnounced(
        run_id="cls", ckpt_dir=str(ckpt), task="classification",
        model_factory=wire.FactorySpec("examples.tiny_cls.model:build_model", {}, str(REPO)),
        data_factory=wire.FactorySpec("examples.tiny_cls.data:validation_set", {}, str(REPO))).encode().decode())
    evald = start_evald(tmp_path, endpoints, ["--ckpt-dir", str(ckpt), "--endpoint", "none", "--idle-exit-s", "2",
                                              "--subset-size", "100", "--batch-size", "32",
                                              "--metric-plugin", "tests.plugin_metric_example:MeanAbsoluteLogit"],
                        cpu=None)
    procs.append(evald)
    assert evald.wait(180) == 0, evald.output()[-3000:]

    # The same predictions, computed here: the same weights on the same seeded subset.
    from evald.pipeline.subset import select_subset

    samples = data.validation_set()
    chosen = [samples[i] for i in select_subset(len(samples), 100, 1234)]
    features = np.stack([f for f, _ in chosen])
    labels = np.array([int(y) for _, y in chosen])
    logits = net(ms.Tensor(features)).asnumpy().astype(np.float64)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    expected = {
        "eval/accuracy": sklearn_metrics.accuracy_score(labels, logits.argmax(1)),
        "eval/macro_f1": sklearn_metrics.f1_score(labels, logits.argmax(1), average="macro", zero_division=0),
        "eval/auc": sklearn_metrics.roc_auc_score(labels, probs, multi_class="ovr", average="macro"),
        "eval/loss": sklearn_metrics.log_loss(labels, probs, labels=[0, 1, 2]),
        "eval/MeanAbsoluteLogit": float(np.abs(logits).mean()),
    }
    for tag, value in expected.items():
        [(step, _, reported)] = scalar_points(run_dir(ckpt), tag)
        assert step == 7
        assert reported == pytest.approx(value, rel=1e-5), tag
