"""Every evald option, defined once: ``evald --help``, the TOML keys, the environment
variables and the table in docs/configuration.md are all generated from these fields.

Top-level fields are flags (``--subset-size``) and top-level TOML keys; a field of kind
``table`` is a TOML table (``[generation]``) and a JSON object on the command line
(``--generation '{"prompts": 0}'``), each of its keys validated like an option.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields

from evald.config.health_thresholds import HealthThresholds
from evald.config.schema import opt
from evald.config.values import DeviceSpec, MinDelta
from evald.contracts import auth


@dataclass(frozen=True)
class GenerationOptions:
    prompts: int = opt(4, "prompts (from the subset) continued at each evaluation; 0 turns generation off",
                       kind="int", min=0, max=256)
    prompt_len: int = opt(32, "prompt length in tokens", kind="int", min=1, max=65536)
    new_tokens: int = opt(32, "tokens generated per prompt", kind="int", min=1, max=4096)
    top_k: int = opt(8, "top-k of the sampled continuation", kind="int", min=1)
    top_p: float = opt(0.95, "top-p of the sampled continuation", kind="float", min=0.0, max=1.0,
                       min_exclusive=True)
    seed: int = opt(7, "seed of the sampled continuation (the same every evaluation)", kind="int", min=0)


@dataclass(frozen=True)
class TuningOptions:
    watch: str = opt("auto", "auto, inotify or polling; auto polls on NFS/CIFS/Lustre/GPFS/FUSE",
                     kind="choice", choices=("auto", "inotify", "polling"))
    polling_interval_s: float = opt(1.0, "seconds between polls of the polling observer", kind="float",
                                    min=0.01, max=3600)
    rescan_interval_s: float = opt(30.0, "seconds between full rescans of the checkpoint directory (finds "
                                   "what events missed)", kind="float", min=0.05, max=86400)
    foreign_settle_s: float = opt(2.0, "a foreign file must keep its size and mtime this long before it "
                                  "is read", kind="float", min=0.0, max=3600)
    max_attempts: int = opt(3, "evaluations of one checkpoint that may be interrupted (crash, kill, "
                            "unexpected error) before it is marked failed", kind="int", min=1, max=1000000)
    verify_swap: str = opt("sampled", "after each hot swap, check that the network holds the checkpoint's weights: "
                           "sampled (a few elements per parameter against the files), full (re-hash the live "
                           "memory against the manifest) or off", kind="choice", choices=("off", "sampled", "full"))
    lease_s: float = opt(60.0, "how long the trainer may rely on evald's retention leases after it last heard "
                         "them (raised to 3x the longest checkpoint load seen)", kind="float", min=2.0,
                         max=7 * 86400.0)
    parts_timeout_s: float = opt(300.0, "seconds the parts of a partitioned snapshot may take to all be "
                                 "committed after the first one; then the step is recorded as incomplete",
                                 kind="float", min=0.0, max=86400)


@dataclass(frozen=True)
class GroupOptions:
    nodes: int = opt(1, "hosts in the eval group; each runs `evald --device ...` with the same device count",
                     kind="int", min=1, max=4096)
    node_rank: int = opt(0, "this host's place in the group, 0..nodes-1; node 0 owns the ledger and sockets",
                         kind="int", min=0, max=4095)
    master_addr: str = opt("127.0.0.1", "address of node 0, where msrun's scheduler listens", kind="str")
    master_port: int | None = opt(None, "msrun's scheduler port (the same on every node); default: a free "
                                  "port (one node only)", kind="int", min=1024, max=65535)
    log_dir: str | None = opt(None, "msrun's worker logs; default: LOGDIR/msrun-RUN_NAME (else ./evald-msrun)",
                              kind="path")
    cluster_time_out: int = opt(600, "seconds msrun waits for every rank to join", kind="int", min=1)
    key_file: str | None = opt(None, "the group's secret (`evald keys DIR` writes DIR/group.key), the same file "
                               "on every host: it authenticates the ranks' commands and answers; needed with "
                               "nodes > 1 (one host: a fresh secret per start)", kind="path")

    def __post_init__(self) -> None:
        if self.node_rank >= self.nodes:
            raise ValueError(f"node_rank {self.node_rank} must be below nodes {self.nodes}")


def is_loopback(address: str) -> bool | None:
    """Whether an IP address (``127.0.0.2``, ``::1``, ``0:0:0:0:0:0:0:1``, ``::ffff:127.0.0.1``) is loopback,
    by the standard ``ipaddress`` module; None for a name (``localhost``), which is decided by the address it
    resolves to when evald binds it (evald.serve.http_thread)."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(parsed, "ipv4_mapped", None)   # ::ffff:127.0.0.1 is IPv4's loopback
    return (mapped or parsed).is_loopback


@dataclass(frozen=True)
class ServeOptions:
    """``--serve HOST:PORT`` / ``[serve]``: the OpenAI-compatible endpoint (docs/serving.md)."""

    SHORTHAND = "listen"  # --serve 127.0.0.1:8000 is {"listen": "127.0.0.1:8000"}

    listen: str | None = opt(None, "HOST:PORT the endpoint listens on (port 0: a free one, written to "
                             "RUN_DIR/serve.json); off when unset", kind="hostport")
    token_file: str | None = opt(None, "file holding the bearer token clients must send (mode 0600 or "
                                 "stricter); required when listening beyond loopback", kind="path")
    queue_size: int = opt(64, "requests waiting for the network; past it a request gets 429 with "
                          "Retry-After", kind="int", min=1, max=100000)
    budget_s: float = opt(0.05, "seconds of queued requests run between two evaluation batches (and per "
                          "loop turn); at least one request runs, so evaluations keep their pace",
                          kind="float", min=0.0, max=60.0)
    max_body_bytes: int = opt(1 << 20, "largest request body; a larger one gets 413", kind="int", min=1024,
                              max=1 << 30)
    max_prompt_tokens: int = opt(4096, "longest prompt in tokens (the model's own window bounds it too)",
                                 kind="int", min=1, max=1 << 20)
    max_prompts: int = opt(32, "prompts in one request (a list)", kind="int", min=1, max=4096)
    max_tokens: int = opt(256, "largest max_tokens a request may ask for", kind="int", min=0, max=65536)
    max_n: int = opt(4, "largest n (choices per prompt)", kind="int", min=1, max=128)
    batch_size: int = opt(8, "rows of each forward pass of served requests", kind="int", min=1, max=4096)
    sample_top_k: int = opt(40, "temperature > 0 samples among this many most likely tokens (then top_p)",
                            kind="int", min=5, max=1024)
    request_timeout_s: float = opt(120.0, "a request not answered by then gets 503 (it waited behind "
                                   "evaluations or other requests)", kind="float", min=0.1, max=86400)
    header_timeout_s: float = opt(10.0, "a connection that has not sent a whole request (headers) or body by "
                                  "then is closed (slowloris)", kind="float", min=0.1, max=3600)
    keep_alive_s: int = opt(5, "idle keep-alive connections are closed after this many seconds (uvicorn's "
                            "timeout_keep_alive)", kind="int", min=1, max=3600)
    limit_concurrency: int = opt(256, "open connections and requests at once; beyond, 503 (uvicorn's "
                                 "limit_concurrency)", kind="int", min=1, max=100000)
    report_every_s: float = opt(10.0, "seconds between serve/* TensorBoard points (one ledger transaction "
                                "each)", kind="float", min=0.1, max=86400)
    max_length: int | None = opt(None, "the served window in tokens (default: the network's max_length, "
                                 "seq_length, seq_len or max_position_embeddings attribute, else the suites' "
                                 "max_length, the smallest); set it for a network without one", kind="int",
                                 min=2, max=1 << 20)

    def __post_init__(self) -> None:
        host = self.listen.rpartition(":")[0].strip("[]") if self.listen else None
        if host is not None and is_loopback(host) is False and not self.token_file:   # a name: when bound
            raise ValueError(f"listen {self.listen!r} is beyond loopback: set serve.token_file (a 0600 file "
                             f"holding the bearer token clients must send), or listen on 127.0.0.1")

    @property
    def enabled(self) -> bool:
        return self.listen is not None


@dataclass(frozen=True)
class SuiteOptions:
    """One benchmark suite, ``[suites.NAME]`` (docs/benchmarks.md)."""

    tasks: tuple = opt(None, "lm-eval task, group or tag names (its registry, or YAMLs under include_path)",
                       kind="strings", factory=tuple)
    include_path: tuple = opt(None, "directories of local lm-eval task YAMLs (lm-eval's include_path)",
                              kind="paths", factory=tuple)
    num_fewshot: int | None = opt(None, "few-shot examples per document (default: each task's own)", kind="int",
                                  min=0, max=1000)
    limit: int | None = opt(None, "documents per task: a fixed subset drawn with seed, the same for every "
                            "checkpoint (default: every document)", kind="int", min=1)
    seed: int = opt(1234, "seed that draws each task's documents (and lm-eval's few-shot seed)", kind="int", min=0)
    every_k: int = opt(1, "evaluate the suite on every k-th evaluated checkpoint (the first is always one)",
                       kind="int", min=1)
    batch_size: int = opt(8, "rows of every forward pass; with the bucket lengths, the graphs compiled",
                          kind="int", min=1, max=4096)
    device: str | None = opt(None, "devices whose ranks split the suite's requests: the ids of --device it may "
                             "use, e.g. 0,1 (default: all of them)", kind="str")
    max_length: int | None = opt(None, "longest input in tokens (default: the model's max_length, seq_length, "
                                 "seq_len or max_position_embeddings)", kind="int", min=2)
    max_gen_toks: int = opt(256, "generate_until's default new-token limit (a task's max_gen_toks wins)",
                            kind="int", min=1, max=65536)
    prefix_token: int | None = opt(None, "token id put before a rolling window's first token and before an "
                                   "empty context (default: lm-eval's convention, the tokenizer's BOS, else "
                                   "its EOS); part of the suite's identity", kind="int", min=0)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("tasks: a suite needs at least one lm-eval task")
        if self.device is not None:
            try:
                ids = [int(x) for x in str(self.device).split(",")]
            except ValueError:
                raise ValueError(f"device: expected device ids such as 0 or 0,1, got {self.device!r}") from None
            if len(set(ids)) != len(ids) or any(i < 0 for i in ids):
                raise ValueError(f"device: expected distinct device ids >= 0, got {self.device!r}")


@dataclass(frozen=True)
class EvaldConfig:
    # --- where to run, where to look, how to reach the trainer
    device: DeviceSpec = opt(None, "device to evaluate on: ID, TARGET:ID (TARGET Ascend, GPU or CPU) or a "
                             "list of IDs; pick one no training rank uses", kind="device",
                             factory=lambda: DeviceSpec("auto", (0,)))
    ckpt_dir: str | None = opt(None, "checkpoint directory to evaluate, or a MindFormers output directory (its "
                               "checkpoint_network/rank_0 and checkpoint/rank_0 too, docs/mindformers.md); "
                               "default: the directory the trainer announces first", kind="path", env="EVALD_CKPT_DIR")
    wait_for_ckpt_dir: bool = opt(False, "wait for a --ckpt-dir whose parent does not exist yet either (else "
                                  "that is an error, a mistyped path); nothing is written until it exists",
                                  kind="bool", env="EVALD_WAIT_FOR_CKPT_DIR")
    logdir: str | None = opt(None, "TensorBoard log directory, shared by runs; each run has LOGDIR/RUN_NAME "
                             "with its events and evald's state (ledger, summary); default: "
                             "CKPT_DIR/../tensorboard, beside the checkpoint directory, never inside it",
                             kind="path", env="EVALD_LOGDIR")
    run_name: str | None = opt(None, "name of this run in TensorBoard (LOGDIR/RUN_NAME); chosen once and kept "
                               "across restarts; default: the checkpoint directory's name (its parent's when "
                               "that is ckpt, checkpoints, output...)", kind="name", env="EVALD_RUN_NAME")
    endpoint: str | None = opt(None, "ZeroMQ endpoint evald binds for notifications (PULL), or none: no "
                               "sockets at all (no control channel either), only the directory is watched; "
                               "default: ipc in $EVALD_SOCKET_DIR", kind="endpoint",
                               env="EVALD_ENDPOINT")
    control_endpoint: str | None = opt(None, "ZeroMQ endpoint evald binds for its control state (PUB); "
                                       "default: beside --endpoint", kind="endpoint", env="EVALD_CONTROL_ENDPOINT")
    app_dir: str | None = opt(None, "directory put first on sys.path before importing the factories; default: "
                              "the search path the trainer announces (where it imports them from)",
                              kind="path", env="EVALD_APP_DIR")
    cpu_affinity: str | None = opt(None, "pin evald to these CPU cores, e.g. 1 or 2-3 (set before mindspore "
                                   "starts); with several devices, split evenly between this node's ranks",
                                   kind="cpus")
    state_mode: str = opt("private", "who may read evald's ledger, TensorBoard events, best.json and summary: "
                          "private (0600 files, 0700 directory) or group (0640, 0750); docs/security.md",
                          kind="choice", choices=("private", "group"), env="EVALD_STATE_MODE")
    server_key: str | None = opt(None, "evald's CURVE secret key file (`evald keys DIR`); with --allowed-keys, "
                                 "both channels are encrypted and only allowed trainers get in "
                                 "(docs/authentication.md)", kind="path", env=auth.ENV_SERVER_KEY)
    allowed_keys: str | None = opt(None, "trainers' CURVE public keys: a directory of *.key files or .key "
                                   "files, several separated by ':'", kind="path_list", env=auth.ENV_ALLOWED_KEYS)
    allow_plaintext: bool = opt(False, "allow an unauthenticated, unencrypted tcp:// endpoint (a trusted "
                                "network only; logged loudly)", kind="bool", env=auth.ENV_ALLOW_PLAINTEXT)
    group: GroupOptions = opt(None, "several devices (--device 4,5,6,7): one msrun eval group, and msrun's "
                              "node options for several hosts ([group] table; docs/eval-group.md)",
                              kind="table", table=GroupOptions, factory=GroupOptions)
    tensor_parallel: int = opt(1, "tensor-parallel degree of the eval group: its ranks hold 1/N of every "
                               "tensor-parallel weight each and evaluate together (N = every rank of --device; "
                               "the model factory builds the rank's shard, docs/eval-group.md)", kind="int",
                               min=1, max=4096)
    # --- what to evaluate
    task: str | None = opt(None, "lm or classification; default: the trainer's announcement, else lm",
                           kind="choice", choices=("lm", "classification"))
    model_factory: str | None = opt(None, "module:function returning the network; default: the trainer's "
                                    "announcement", kind="factory")
    model_kwargs: dict | None = opt(None, "keyword arguments of the model factory (JSON object / TOML table)",
                                    kind="object")
    data_factory: str | None = opt(None, "module:function returning the validation set; default: the "
                                   "trainer's announcement", kind="factory")
    data_kwargs: dict | None = opt(None, "keyword arguments of the data factory (JSON object / TOML table)",
                                   kind="object")
    tokenizer_factory: str | None = opt(None, "module:function returning the benchmarks' tokenizer (encode, "
                                        "decode, eos_id; or a Hugging Face-style one); default: bytes "
                                        "(docs/benchmarks.md)", kind="factory")
    tokenizer_kwargs: dict | None = opt(None, "keyword arguments of the tokenizer factory (JSON object / TOML "
                                        "table)", kind="object")
    suites: dict = opt(None, "benchmark suites run with lm-evaluation-harness on each checkpoint ([suites.NAME] "
                       "tables; JSON object of them on the command line; docs/benchmarks.md)", kind="suites",
                       table=SuiteOptions, factory=dict)
    subset_size: int = opt(256, "validation samples per evaluation: a seeded, fixed subset", kind="int", min=1)
    subset_seed: int = opt(1234, "seed that picks the subset (the same samples for every checkpoint)",
                           kind="int", min=0)
    batch_size: int = opt(32, "evaluation batch size; every batch has this shape, so nothing recompiles",
                          kind="int", min=1, max=1 << 20)
    generation: GenerationOptions = opt(None, "sample-quality generation for language models ([generation] "
                                        "table)", kind="table", table=GenerationOptions, factory=GenerationOptions)
    metric_plugins: tuple = opt(None, "extra mindspore.train.Metric classes, 'module:Class' "
                                "([[metric_plugins]] in TOML; repeat --metric-plugin)", kind="plugins",
                                factory=tuple)
    factory_allow: tuple = opt(None, "import model and data factories only from these module prefixes, e.g. "
                               "mypkg.,examples. (default: any module a trusted source names; docs/security.md)",
                               kind="modules", factory=tuple, env="EVALD_FACTORY_ALLOW")
    # --- when to evaluate, and when to stop serving
    lag_policy: str = opt("latest", "when checkpoints arrive faster than evaluations: latest, all or every-k",
                          kind="choice", choices=("latest", "all", "every-k"))
    every_k: int | None = opt(None, "with --lag-policy every-k: evaluate every k-th checkpoint (default 2)",
                              kind="int", min=1)
    foreign_steps_per_epoch: int | None = opt(None, "steps per epoch, to turn ModelCheckpoint names "
                                              "PREFIX-E_S.ckpt into global steps (MindFormers' are found in its "
                                              "full checkpoints)", kind="int", min=1)
    serve: ServeOptions = opt(None, "serve the checkpoint in the network over an OpenAI-compatible HTTP API: "
                              "HOST:PORT, or the [serve] table (docs/serving.md)", kind="table",
                              table=ServeOptions, factory=ServeOptions)
    serve_forever: bool = opt(False, "keep running after the run has finished", kind="bool")
    idle_exit_s: float | None = opt(None, "exit after this many seconds with nothing to do: 0 if all is "
                                    "done, 3 if checkpoints are still waiting (default: never)",
                                    kind="float", min=0.0, min_exclusive=True)
    tuning: TuningOptions = opt(None, "directory watching and retries ([tuning] table)", kind="table",
                                table=TuningOptions, factory=TuningOptions)
    # --- decisions (docs/early-stopping.md)
    monitor: str = opt("eval/loss", "metric that early stopping and the best pointer watch: an evald tag "
                       "(eval/loss) or a suite's SUITE/TASK/METRIC (fast/hellaswag/acc_norm)", kind="str")
    mode: str = opt("min", "min or max: which direction of MONITOR is better", kind="choice",
                    choices=("min", "max"))
    patience: int | None = opt(None, "evaluations without improvement before stopping; default: never stop",
                               kind="int", min=1)
    min_delta: MinDelta = opt(None, "smallest change of MONITOR that counts as an improvement: a number (0.01) or "
                              "standard errors of MONITOR on the fixed subset (2se)", kind="delta", min=0.0,
                              factory=MinDelta)
    stopping_threshold: float | None = opt(None, "stop as soon as MONITOR is this good", kind="float")
    divergence_threshold: float | None = opt(None, "stop as soon as MONITOR is this bad", kind="float")
    check_finite: bool = opt(True, "stop when MONITOR is nan or inf", kind="bool")
    stop_margin_steps: int | None = opt(None, "training stops this many steps after the newest step evald "
                                        "knows of when it decides; default: the trainer's every_n_steps "
                                        "(it replaces it, it is not added)", kind="int", min=1)
    health: HealthThresholds = opt(None, "training-health alert thresholds and learning-rate advice ([health] "
                                   "table); see docs/metrics.md", kind="table", table=HealthThresholds,
                                   factory=HealthThresholds)
    advisory_stop: bool = opt(False, "decide early stops but never stop training: the decision is logged, written "
                              "to TensorBoard and published as advice (docs/early-stopping.md)", kind="bool")
    # --- logging
    log_level: str = opt("INFO", "DEBUG, INFO, WARNING or ERROR", kind="choice",
                         choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    log_format: str = opt("text", "text (for people) or json (one JSON object per line, for log shippers)",
                          kind="choice", choices=("text", "json"), env="EVALD_LOG_FORMAT")

    @property
    def zmq(self) -> bool:
        return self.endpoint != "none"

    @property
    def effective_every_k(self) -> int:
        return self.every_k or 2

    @property
    def group_size(self) -> int:
        """Eval ranks: devices per host times hosts; more than 1 makes an msrun eval group."""
        return len(self.device.ids) * self.group.nodes


def option_fields() -> list:
    return list(fields(EvaldConfig))


# Fields an announcement (RUN.json or run_announced) may fill when the operator left them unset.
ANNOUNCED = ("task", "model_factory", "model_kwargs", "data_factory", "data_kwargs", "app_dir")

# How `evald --help` groups the options: (title, description, options). An option not named here
# joins the group of the option defined before it in EvaldConfig (so a new option lands beside its
# neighbours); evald/cli/main.py:grouped_options applies the rule.
HELP_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("input", "which checkpoints, where results go, how the trainer reaches evald",
     ("device", "ckpt_dir", "logdir", "run_name", "endpoint", "control_endpoint", "app_dir", "cpu_affinity",
      "group", "tensor_parallel")),
    ("security", "who may read evald's state, talk to it, and name code it imports (docs/security.md)",
     ("state_mode", "server_key", "allowed_keys", "allow_plaintext", "factory_allow")),
    ("evaluation", "what one evaluation computes, on which samples",
     ("task", "model_factory", "model_kwargs", "data_factory", "data_kwargs", "subset_size", "subset_seed",
      "batch_size", "generation", "metric_plugins")),
    ("scheduling", "which checkpoints to evaluate when they come faster than evaluations, and when to exit",
     ("lag_policy", "every_k", "foreign_steps_per_epoch", "serve_forever", "idle_exit_s")),
    ("early stopping", "when to stop training, and the health alerts (docs/early-stopping.md, docs/metrics.md)",
     ("monitor", "mode", "patience", "min_delta", "stopping_threshold", "divergence_threshold", "check_finite",
      "stop_margin_steps", "advisory_stop", "health")),
    ("tuning", "directory watching, retries, swap checks ([tuning] table)", ("tuning",)),
    ("logging", "", ("log_level", "log_format")),
)
