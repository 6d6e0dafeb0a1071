#!/usr/bin/env bash
# Creates .venv-mindformers: evald beside MindFormers 2.0.0, as a MindFormers user has them, for the recipe
# test of docs/mindformers.md (tests/e2e/test_mindformers_recipe.py). Once per version of this script and
# of pyproject.toml; scripts/test.sh runs it after scripts/setup_env.sh.
#
# Why a venv of its own: MindFormers pins transformers==4.57.1 and nltk==3.9.1, which the project's .venv
# does not otherwise carry; the other tests keep running without MindFormers, as most users do. It is
# layered on .venv (a .pth line adds .venv's site-packages after its own), so evald, mindspore and the rest
# are not installed twice: only what MindFormers adds lands here (about 400 MB, a minute).
# Why --no-deps: mindformers 2.0.0 requires hyper-parallel~=1.0.0, which the package index does not have;
# its other requirements are installed by name below (from its wheel's METADATA). MindFormers imports
# hyper_parallel from its PyNative trainer only; the test puts tests/mindformers_stand_in/ on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/python ]] || { echo "setup_mindformers: run scripts/setup_env.sh first (.venv is missing)" >&2; exit 2; }
venv=.venv-mindformers
base=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [[ ! -x $venv/bin/python ]]; then
    .venv/bin/python -m venv "$venv"   # the same Python as .venv's (venv uses the base interpreter)
fi
stamp=$venv/.evald-installed
want=$(cat pyproject.toml scripts/setup_mindformers.sh | sha256sum | cut -c1-16)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    echo "setup_mindformers: installing MindFormers 2.0.0 into $venv, on top of .venv"
    own=$($venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$base')" > "$own/zz_evald_base.pth"
    constraints=$(mktemp)
    trap 'rm -f "$constraints"' EXIT
    # NumPy 1.x for the mindspore wheel; pyarrow below 26, which refuses NumPy 1.x at import.
    printf 'numpy<2\npyarrow<26\n' > "$constraints"
    $venv/bin/python -m pip install --quiet -c "$constraints" \
        "setuptools>=83.0.0" "sentencepiece>=0.2.1" "ftfy>=6.1.1" "regex>=2022.10.31" "tqdm>=4.65.0" \
        "pyyaml>=6.0" "jieba>=0.42.1" "rouge_chinese>=1.0.3" "nltk==3.9.1" "mindpet==1.0.4" \
        opencv-python-headless tokenizers "astunparse>=1.6.3" tiktoken jinja2 setproctitle safetensors \
        tensorboardX "deprecated>=1.2.0" pybind11 "transformers==4.57.1" "datasets>=4.0.0"
    $venv/bin/python -m pip install --quiet --no-deps "mindformers==2.0.0"
    $venv/bin/python -c "import evald, mindspore, importlib.metadata as m; m.version('mindformers')"
    echo "$want" > "$stamp"
fi
