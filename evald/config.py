"""evald's configuration: one dataclass, filled from defaults < TOML < environment < CLI.

The run announcement (RUN.json / the ``run_announced`` message) supplies only
what the operator did not set: the model and data factories, the task and the
checkpoint directory. Explicit evald configuration always wins, because the
person starting evald chose it on purpose. docs/configuration.md has the table.

Every field's metadata carries its help text, so ``evald --help`` and the docs
list each option with its default from one place.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from evald.contracts.wire import FactorySpec, default_control_endpoint, default_endpoint


def _opt(default: Any, help: str, *, env: str | None = None, choices: tuple[str, ...] | None = None,
         factory: Any = None) -> Any:
    meta = {"help": help, "env": env, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class EvaldConfig:
    # --- where
    device: int = _opt(0, "device id to evaluate on; pick one no training rank uses")
    device_target: str = _opt("auto", "Ascend, GPU or CPU; auto picks the first available",
                              choices=("auto", "Ascend", "GPU", "CPU"))
    ckpt_dir: str | None = _opt(None, "checkpoint directory to watch; default: learned from the first "
                                "notification", env="EVALD_CKPT_DIR")
    logdir: str | None = _opt(None, "TensorBoard/ledger output directory; default: CKPT_DIR/evald")
    endpoint: str = _opt(None, "ZeroMQ endpoint to bind for notifications (PULL)", env="EVALD_ENDPOINT",
                         factory=default_endpoint)
    control_endpoint: str = _opt(None, "ZeroMQ endpoint to bind for the control state (PUB)",
                                 env="EVALD_CONTROL_ENDPOINT", factory=default_control_endpoint)
    zmq: bool = _opt(True, "bind the notification and control sockets (--no-zmq: watch the directory only)")
    app_dir: str | None = _opt(None, "directory prepended to sys.path before importing factories")
    cpu_affinity: str | None = _opt(None, "pin evald to these CPU cores, e.g. '1' or '2-3' (before "
                                    "mindspore starts)")
    # --- what
    task: str | None = _opt(None, "lm or classification; default: from the run announcement",
                            choices=("lm", "classification"))
    model_factory: str | None = _opt(None, "module:function returning the network; default: from the "
                                     "run announcement")
    model_kwargs: dict = _opt(None, "JSON/TOML table of keyword arguments for the model factory",
                              factory=dict)
    data_factory: str | None = _opt(None, "module:function returning the validation set; default: "
                                    "from the run announcement")
    data_kwargs: dict = _opt(None, "JSON/TOML table of keyword arguments for the data factory",
                             factory=dict)
    subset_size: int = _opt(256, "validation samples per evaluation (a seeded fixed subset)")
    subset_seed: int = _opt(1234, "seed that picks the subset: same samples for every checkpoint")
    batch_size: int = _opt(32, "evaluation batch size; every batch has this shape (no recompiles)")
    # --- sample quality (language models)
    generation_prompts: int = _opt(4, "prompts (from the subset) to continue at each evaluation; 0 = off")
    generation_prompt_len: int = _opt(32, "prompt length in tokens")
    generation_new_tokens: int = _opt(32, "tokens generated per prompt")
    generation_top_k: int = _opt(8, "top-k for the sampled continuation")
    generation_top_p: float = _opt(0.95, "top-p for the sampled continuation")
    generation_seed: int = _opt(7, "seed of the sampled continuation")
    metric_plugins: tuple = _opt(None, "extra mindspore.train.Metric classes ([[metrics.plugins]])",
                                 factory=tuple)
    # --- when
    lag_policy: str = _opt("latest", "when checkpoints arrive faster than evaluation: latest, all or every-k",
                           choices=("latest", "all", "every-k"))
    every_k: int = _opt(2, "with --lag-policy every-k: evaluate every k-th checkpoint")
    rescan_interval_s: float = _opt(30.0, "seconds between directory rescans (finds what events missed)")
    watch: str = _opt("auto", "auto, inotify or polling; auto polls on NFS/CIFS/Lustre/GPFS/FUSE",
                      choices=("auto", "inotify", "polling"))
    polling_interval_s: float = _opt(1.0, "polling observer interval")
    foreign_steps_per_epoch: int | None = _opt(None, "steps per epoch, to turn ModelCheckpoint names "
                                               "PREFIX-E_S.ckpt into global steps")
    foreign_settle_s: float = _opt(2.0, "a foreign file must keep its size this long before it is read")
    orphan_temp_age_s: float = _opt(300.0, "at start, delete temp checkpoint dirs untouched this long (left "
                                    "by a writer that died)")
    max_attempts: int = _opt(3, "evaluations of one checkpoint interrupted by evald crashes before it is "
                             "marked failed")
    serve_forever: bool = _opt(False, "keep running after the run-finished message")
    idle_exit_s: float | None = _opt(None, "exit 0 after this many seconds with nothing to do (default: never)")
    # --- early stop (docs/early-stopping.md)
    monitor: str = _opt("eval/loss", "metric the early-stop policy and the best pointer watch")
    mode: str = _opt("min", "min or max: which direction of MONITOR is better", choices=("min", "max"))
    patience: int | None = _opt(None, "evaluations without improvement before stopping; unset = never stop")
    min_delta: float = _opt(0.0, "smallest change that counts as an improvement")
    baseline: float | None = _opt(None, "stop if MONITOR is not better than this after PATIENCE evaluations")
    stopping_threshold: float | None = _opt(None, "stop as soon as MONITOR is this good")
    divergence_threshold: float | None = _opt(None, "stop as soon as MONITOR is this bad")
    check_finite: bool = _opt(True, "stop when MONITOR is nan or inf")
    stop_margin_steps: int = _opt(0, "stop-at step = checkpoint step + every_n_steps + this margin")
    lr_advice: bool = _opt(True, "publish learning-rate advice (overfitting / plateau) on the control channel")
    advice_window: int = _opt(3, "evaluations a stall must last before learning-rate advice is given")
    control_republish_s: float = _opt(1.0, "seconds between re-publications of the control state")
    health_thresholds: dict = _opt(None, "training-health alert thresholds ([health] table or JSON), e.g. "
                                   "grad_norm_explosion, grad_norm_vanishing, vanishing_window; see docs/metrics.md",
                                   factory=dict)
    # --- logging
    log_level: str = _opt("INFO", "DEBUG, INFO, WARNING or ERROR")

    def resolved_logdir(self) -> Path | None:
        if self.logdir:
            return Path(self.logdir)
        if self.ckpt_dir:
            return Path(self.ckpt_dir) / "evald"
        return None

    def factory(self, which: str) -> FactorySpec | None:
        target = getattr(self, f"{which}_factory")
        if not target:
            return None
        return FactorySpec(target, dict(getattr(self, f"{which}_kwargs")), self.app_dir)


def option_fields() -> list:
    return list(fields(EvaldConfig))


def default_of(f) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


_TOML_SECTIONS = {"early_stop": "", "generation": "generation_", "metrics": "", "evald": ""}


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Flatten an evald TOML file into field values. Unknown keys are an error, not a silent no-op."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    values: dict[str, Any] = {}
    known = {f.name for f in fields(EvaldConfig)}

    def put(key: str, value: Any, where: str) -> None:
        name = key.replace("-", "_")
        if name not in known:
            raise ValueError(f"{path}: unknown option {where}{key!r}; see `evald --help` for the list")
        values[name] = value

    for key, value in data.items():
        if key == "metrics" and isinstance(value, dict):
            for sub, sub_value in value.items():
                if sub == "plugins":
                    values["metric_plugins"] = tuple(sub_value)
                else:
                    raise ValueError(f"{path}: unknown option [metrics].{sub}")
        elif key == "generation" and isinstance(value, dict):
            for sub, sub_value in value.items():
                put("generation_" + sub, sub_value, "[generation].")
        elif key == "health" and isinstance(value, dict):
            values["health_thresholds"] = dict(value)
        elif isinstance(value, dict) and key in ("early_stop", "evald"):
            for sub, sub_value in value.items():
                put(sub, sub_value, f"[{key}].")
        elif isinstance(value, dict) and key in ("model", "data"):
            for sub, sub_value in value.items():
                if sub == "factory":
                    values[f"{key}_factory"] = sub_value
                elif sub == "kwargs":
                    values[f"{key}_kwargs"] = dict(sub_value)
                else:
                    raise ValueError(f"{path}: unknown option [{key}].{sub}; expected factory or kwargs")
        else:
            put(key, value, "")
    return values


def environment_values() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in fields(EvaldConfig):
        env = f.metadata.get("env")
        if env and os.environ.get(env):
            values[f.name] = os.environ[env]
    return values


def build_config(toml_path: str | None, cli_values: dict[str, Any]) -> EvaldConfig:
    """defaults < TOML < environment < CLI (only options given on the command line)."""
    values: dict[str, Any] = {}
    if toml_path:
        values.update(load_toml(toml_path))
    values.update(environment_values())
    values.update({k: v for k, v in cli_values.items() if v is not None})
    config = EvaldConfig(**values)
    from evald.health import HealthThresholds

    HealthThresholds.from_mapping(config.health_thresholds)  # a typo fails here, not mid-run
    return replace(config, metric_plugins=tuple(config.metric_plugins))
