"""docs/mindformers.md is a recipe that runs (issue 18, item 9), as far as this machine can tell.

This is the fast layer, without MindFormers (evald does not depend on it; the project's .venv
does not carry it). tests/e2e/test_mindformers_recipe.py follows the page with the real MindFormers,
in .venv-mindformers. Here, in seconds:

* every Python, YAML, TOML and shell snippet of the page parses;
* every ``evald`` command and the TOML pass evald's own validation (``parse_config``, the
  validator every source goes through);
* the model kwargs are the tiny LLaMA's (``LLAMA`` of ``# mypkg/llama.py``) wherever the page
  names the model factory: the evald command, the TOML, the training script's callback and the
  YAML callback; without them MindFormers builds its 7B default;
* the YAML callback's keys are ``EvaldCallback``'s (its signature and its hook's);
* the page's ``mypkg`` modules, written out as the page names them, run: the data factory for
  real, through evald's own factory loader, and the model factory with a STAND-IN for
  ``mindformers`` (LlamaConfig / LlamaForCausalLM that record their arguments and return
  MindFormers' eval-mode triple), because the project's .venv has no MindFormers;
* the page cites no machine-local path, states the mode of ``checkpoint_network/``, shows a CPU
  device, and the README's MindFormers example agrees with the page.
"""

from __future__ import annotations

import ast
import inspect
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.doc_snippets import blocks, evald_commands, python_files, run_python_file, write_python_files

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "mindformers.md"


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text()


@pytest.fixture(scope="module")
def llama(page) -> dict:
    return run_python_file(page, "mypkg/llama.py")["LLAMA"]


def test_every_snippet_parses(page):
    kinds = {}
    for language, code in blocks(page):
        kinds[language] = kinds.get(language, 0) + 1
        if language == "python":
            ast.parse(code)
        elif language == "yaml":
            yaml.safe_load(code)
        elif language == "toml":
            tomllib.loads(code)
        elif language == "bash":
            for line in code.replace("\\\n", " ").splitlines():
                shlex.split(line, comments=True)
    assert kinds.get("python", 0) >= 5 and kinds.get("yaml") and kinds.get("toml") and kinds.get("bash", 0) >= 2
    assert set(python_files(page)) >= {"mypkg/llama.py", "mypkg/eval_model.py", "mypkg/eval_data.py", "train.py"}


def test_the_evald_commands_and_the_toml_pass_evalds_validation(page, llama, monkeypatch, tmp_path):
    from evald.cli.main import parse_config

    monkeypatch.chdir(tmp_path)  # --app-dir . must exist: the directory holding mypkg/
    commands = evald_commands(page)
    assert len(commands) >= 2
    configs = [parse_config(argv, environ={}).config for argv in commands]
    with_kwargs = [c for c in configs if c.model_factory]
    assert with_kwargs and all(c.model_kwargs == llama for c in with_kwargs), "the evald command's --model-kwargs"
    assert any(c.device.target == "CPU" for c in configs), "a command a CPU-only machine can run"
    toml, suites = [code for language, code in blocks(page) if language == "toml"]
    (tmp_path / "evald.toml").write_text(toml)
    from_toml = parse_config(["--config", "evald.toml"], environ={}).config
    top, tables = suites.split("\n[", 1)   # section 3: its top-level key among section 1's, its tables at the end
    head, rest = toml.split("\n[", 1)
    (tmp_path / "suites.toml").write_text(f"{head}\n{top}\n[{rest}\n[{tables}")
    with_suite = parse_config(["--config", "suites.toml"], environ={}).config
    assert with_suite.tokenizer_factory == "mypkg.eval_tokenizer:build" and list(with_suite.suites) == ["hellaswag"]
    assert from_toml.model_kwargs == llama and from_toml.device.target == "CPU"
    assert (from_toml.model_factory, from_toml.data_factory, from_toml.data_kwargs) == (
        with_kwargs[0].model_factory, with_kwargs[0].data_factory, with_kwargs[0].data_kwargs)


def test_the_training_script_and_the_yaml_give_the_factory_the_same_kwargs(page, llama):
    from trainer_hooks import EvaldCallback, EvaldHook

    train = ast.parse(python_files(page)["train.py"])
    [call] = [n for n in ast.walk(train) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "EvaldCallback"]
    model_factory = next(k.value for k in call.keywords if k.arg == "model_factory")
    kwargs = dict(zip([ast.literal_eval(k) for k in model_factory.keys], model_factory.values))
    assert isinstance(kwargs["kwargs"], ast.Name) and kwargs["kwargs"].id == "LLAMA"

    [config] = [yaml.safe_load(code) for language, code in blocks(page) if language == "yaml"]
    [entry] = [c for c in config["callbacks"] if c["type"] == "EvaldMFCallback"]
    args = {k: v for k, v in entry.items() if k != "type"}
    assert args["model_factory"]["kwargs"] == llama
    assert args["data_factory"]["kwargs"] == {"seq_length": llama["seq_length"], "vocab_size": llama["vocab_size"]}
    own = inspect.signature(EvaldCallback.__init__).parameters
    hook = inspect.signature(EvaldHook.__init__).parameters
    unknown = [k for k in args if k not in own and k not in hook]
    assert not unknown, f"YAML keys EvaldCallback does not take: {unknown}"


def test_the_factories_run(page, llama, tmp_path, monkeypatch):
    from evald.contracts.wire import FactorySpec
    from evald.pipeline.factories import call_factory

    write_python_files(page, tmp_path, under="mypkg/")
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    # STAND-IN for mindformers (not in this venv): records the config, returns the eval-mode triple.
    (tmp_path / "stand_in" / "mindformers").mkdir(parents=True)
    (tmp_path / "stand_in" / "mindformers" / "__init__.py").write_text(
        "from mindspore import nn\n"
        "class LlamaConfig:\n"
        "    def __init__(self, **kwargs):\n"
        "        self.kwargs = kwargs\n"
        "class LlamaForCausalLM(nn.Cell):\n"
        "    def __init__(self, config):\n"
        "        super().__init__()\n"
        "        self.config = config\n"
        "    def construct(self, input_ids):\n"
        "        return input_ids * 2, input_ids, input_ids\n")
    monkeypatch.syspath_prepend(str(tmp_path / "stand_in"))
    monkeypatch.syspath_prepend(str(tmp_path))  # the factories' search path, undone after the test
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        monkeypatch.delitem(sys.modules, name)

    data = call_factory(FactorySpec("mypkg.eval_data:validation", {"seq_length": llama["seq_length"],
                                                                  "vocab_size": llama["vocab_size"]},
                                    str(tmp_path)), "data")
    assert len(data) >= 256  # evald's default subset size
    assert all(len(row) == llama["seq_length"] + 1 for row in data)  # T + 1 token ids per row
    assert data.min() >= 1 and data.max() < llama["vocab_size"]

    import mindspore as ms

    model = call_factory(FactorySpec("mypkg.eval_model:build", llama, str(tmp_path)), "model")
    assert model.net.config.kwargs == llama
    out = model(ms.Tensor(data[:2, :-1]))
    assert out.shape == (2, llama["seq_length"]) and (out.asnumpy() == data[:2, :-1] * 2).all()  # the logits


def test_the_page_says_what_a_reader_needs(page):
    assert not re.search(r"/work/|/home/|/tmp/", page), "a machine-local path"
    assert "not been run" not in page and "not run against" not in page
    assert re.search(r"`checkpoint_network/` was 0755", page)
    assert "rows are `seq_length + 1` token ids" in page  # the data factory's contract, here
    readme = (REPO / "README.md").read_text()
    mindformers_example = readme[readme.index("# 3. MindFormers"):readme.index("trainer.train()")]
    assert 'EvaldCallback("output"' in mindformers_example and "network=net" in mindformers_example
    assert 'output_dir="output"' in mindformers_example
    assert 'EvaldCallback(\n    "output"' in page and 'output_dir="./output"' in page
