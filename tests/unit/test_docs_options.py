"""Every ``--option`` that README.md, docs/ and deploy/ show is one the command it belongs to accepts.

What is read: Markdown (fenced code blocks line by line, inline code spans, and the prose
around them), shell scripts and the Slurm job (each logical line and each comment), the
systemd unit (its ``ExecStart=`` lines and comments) and the Kubernetes manifests (their
``command``/``args`` lists, and their comments).

Which parser judges an option: the command that precedes it on the same command line.

* ``evald`` (also ``.venv/bin/evald``, ``python -m evald``): ``evald.cli.main.build_parser()``;
  ``evald SUB`` for every name in ``evald.cli.main.SUBCOMMANDS``: the parser that subcommand
  builds, caught when it parses (so subcommands added later are covered with no change here);
* the project's own scripts and modules (``examples/tiny_lm/train.py``, ``python -m bench.scale``):
  the parser each builds when run, caught the same way before it does any work;
* anything else (msrun, srun, sbatch, tensorboard, kubectl, a user's own ``train.py``): not ours,
  not checked;
* an option with no command before it (prose, a table cell, ``--tuning '{...}'`` in backticks)
  must be known to evald or one of its subcommands.

An option that evald 0.1 had and this evald does not may appear only in the table of
docs/configuration.md that says what became of it ("What changed from evald 0.1");
anywhere else it is reported with what replaced it.
"""

from __future__ import annotations

import argparse
import re
import runpy
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
REMOVED_SECTION = "## What changed from evald 0.1"
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
SEPARATORS = {"|", "||", "&&", ";", "&", "(", ")", "do", "then", "else"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Snippet:
    """A piece of a document read as one command line (or as prose when ``prose``)."""

    file: str  # relative to the repository
    line: int
    text: str
    prose: bool = False


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    option: str
    command: str  # "evald", "evald status", "examples/tiny_lm/train.py", or "" (no command before it)


# --- reading the documents


def documents() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found += sorted(p for p in (REPO / "deploy").rglob("*") if p.is_file())
    return found


def snippets(path: Path, root: Path = REPO) -> list[Snippet]:
    rel = str(path.relative_to(root))
    text = path.read_text()
    if path.suffix == ".md":
        return list(_markdown(rel, text))
    if path.suffix in (".yaml", ".yml"):
        return list(_yaml(rel, text))
    return list(_script(rel, text))


def _logical_lines(text: str):
    """(first line number, text) with backslash-continued lines joined."""
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def _split_comment(line: str) -> tuple[str, str]:
    """A shell line's code and its comment (a '#' at the start or after a blank)."""
    match = re.search(r"(^|\s)#", line)
    return (line, "") if match is None else (line[:match.start()], line[match.end():])


def _markdown(rel: str, text: str):
    fence, language = None, ""
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            fence, language = stripped[:3], stripped[3:].strip().lower()
            block_start, block = number + 1, []
            while number < len(lines) and not lines[number].strip().startswith(fence):
                block.append(lines[number])
                number += 1
            number += 1  # the closing fence
            fence = None
            if language in ("python", "py", "toml", "json", "yaml"):
                # Not command lines: options there are strings of some other program; read as prose.
                for offset, code in enumerate(block):
                    yield Snippet(rel, block_start + offset, code, prose=True)
                continue
            for first, logical in _logical_lines("\n".join(block)):
                code, comment = _split_comment(re.sub(r"^\s*\$\s+", "", logical))
                if comment.lstrip().startswith("--"):  # `cmd   # --more 20 --options`: more of cmd's options
                    code, comment = f"{code} {comment}", ""
                yield Snippet(rel, block_start + first - 1, code)
                if comment:
                    yield Snippet(rel, block_start + first - 1, comment, prose=True)
            continue
        for span in re.finditer(r"``?([^`]+)``?", line):
            owner = re.search(r"(\w+)'s? $", line[:span.start()])
            if owner and owner.group(1).lower() != "evald":  # "msrun's `--node_rank`": another program's
                yield Snippet(rel, number, f"{owner.group(1)} {span.group(1)}")
            else:
                yield Snippet(rel, number, span.group(1))
        yield Snippet(rel, number, re.sub(r"``?[^`]+``?", " ", line), prose=True)


def _script(rel: str, text: str):
    for number, logical in _logical_lines(text):
        if logical.lstrip().startswith("#SBATCH"):
            yield Snippet(rel, number, "sbatch " + logical.lstrip()[len("#SBATCH"):])
            continue
        code, comment = _split_comment(logical)
        if rel.endswith(".service"):
            code = code.partition("=")[2] if re.match(r"^\s*Exec\w*=", code) else ""
        # ${VAR:-default}: the default is the start of a command line's arguments
        yield Snippet(rel, number, re.sub(r"\$\{(\w+):-", r"${\1:- ", code))
        if comment:
            # a comment's commands (`sudo systemctl start evald@exp1`) read as a command line
            yield Snippet(rel, number, comment)


def _yaml(rel: str, text: str):
    import yaml

    comments = [_split_comment(line)[1] for line in text.splitlines()]
    for number, comment in _logical_lines("\n".join(comments)):  # commands continued over comment lines
        if comment.strip():
            yield Snippet(rel, number, comment)
    for document in yaml.safe_load_all(text):
        for command in _command_lists(document):
            first = next((i for i, line in enumerate(text.splitlines(), 1) if f'"{command[0]}"' in line
                          or f"- {command[0]}" in line), 0)
            yield Snippet(rel, first, " ".join(str(word) for word in command))


def _command_lists(node):
    """Every container's command + args in a Kubernetes manifest."""
    if isinstance(node, dict):
        if isinstance(node.get("command"), list) or isinstance(node.get("args"), list):
            yield list(node.get("command") or []) + list(node.get("args") or [])
        for value in node.values():
            yield from _command_lists(value)
    elif isinstance(node, list):
        for value in node:
            yield from _command_lists(value)


# --- which command an option belongs to


def _word(token: str) -> str:
    return token.strip("\"'`,[](){}<>:;")


def attribute(snippet: Snippet) -> list[Finding]:
    """Each option of a snippet with the command it belongs to ("" for none)."""
    findings = []
    if snippet.prose:
        return [Finding(snippet.file, snippet.line, m.group(), "") for m in OPTION.finditer(snippet.text)]
    from evald.cli.main import SUBCOMMANDS

    command, at_command_position = "", True
    tokens = snippet.text.split()
    for i, token in enumerate(tokens):
        word = _word(token)
        if token in SEPARATORS or token.endswith(";") or token.startswith("$("):
            command, at_command_position = "", True
            if not token.startswith("$("):
                continue
            word = _word(token[2:])
        if _word(token) == "--" and command == "evald backfill":
            command = "evald"   # `evald backfill ... -- EVALD_OPTIONS`: what follows is evald's own
            continue
        options = [m.group() for m in OPTION.finditer(token.partition("=")[0] if token.startswith("--")
                                                          else token)]
        if word == "evald" or word.endswith("/evald"):
            command = "evald"
            following = _word(tokens[i + 1]) if i + 1 < len(tokens) else ""
            if following in SUBCOMMANDS:
                command = f"evald {following}"
            at_command_position = False
            continue
        if word in ("python", "python3") or word.endswith(("/python", "/python3")):
            following = _word(tokens[i + 1]) if i + 1 < len(tokens) else ""
            module = _word(tokens[i + 2]) if following == "-m" and i + 2 < len(tokens) else ""
            if module == "evald":
                command = "evald"
            elif module.startswith("bench."):
                command = f"python -m {module}"
            elif module:
                command = f"python -m {module} (not ours)"
            at_command_position = False
            continue
        if word.endswith(".py"):
            script = word.removeprefix("./")
            command = script if (REPO / script).is_file() and "/" in script else f"{script} (not ours)"
            at_command_position = False
            continue
        if at_command_position and not options:
            if ENV_ASSIGNMENT.match(word):
                continue  # VAR=value before a command
            command, at_command_position = f"{word} (not ours)", False
            continue
        findings += [Finding(snippet.file, snippet.line, option, command) for option in options]
    return findings


# --- what each command accepts


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _catching_parser(run) -> set[str]:
    """The option strings of the first parser ``run()`` parses with, caught before it does more."""
    original = argparse.ArgumentParser.parse_known_args  # parse_args and parse_intermixed_args call it

    def catch(self, *args, **kwargs):
        raise _Caught(self)

    argparse.ArgumentParser.parse_known_args = catch  # type: ignore[method-assign]
    saved_argv = sys.argv
    try:
        run()
    except _Caught as caught:
        return {s for s in caught.parser._option_string_actions if s.startswith("--")}
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
        sys.argv = saved_argv
    raise AssertionError("it never parsed a command line")


@lru_cache(maxsize=None)
def accepted(command: str) -> frozenset[str] | None:
    """The options ``command`` accepts; None for a command that is not ours."""
    from evald.cli.main import build_parser, main

    if command.endswith("(not ours)"):
        return None
    if command == "evald":
        return frozenset(s for s in build_parser()._option_string_actions if s.startswith("--"))
    if command.startswith("evald "):
        name = command.split()[1]
        return frozenset(_catching_parser(lambda: main([name, "--help"])))
    if command.startswith("python -m "):
        module = command.split()[2]
        sys.argv = [module, "--help"]
        sys.modules.pop(module, None)   # imported by another test in this worker: runpy would warn, and run it stale
        return frozenset(_catching_parser(lambda: runpy.run_module(module, run_name="__main__")))
    script = REPO / command
    sys.argv = [str(script), "--help"]
    return frozenset(_catching_parser(lambda: runpy.run_path(str(script), run_name="__main__")))


def evald_options() -> frozenset[str]:
    from evald.cli.main import SUBCOMMANDS

    every = set(accepted("evald"))
    for name in SUBCOMMANDS:
        every |= accepted(f"evald {name}")
    return frozenset(every)


# --- the table of what became of evald 0.1's options


def removed_options() -> tuple[dict[str, str], range]:
    """{option: what replaced it} from docs/configuration.md, and the lines of that table."""
    lines = (REPO / "docs" / "configuration.md").read_text().splitlines()
    start = lines.index(REMOVED_SECTION) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("## "))
    became = {}
    for line in lines[start:end]:
        if line.startswith("|") and not set(line) <= set("|- "):
            old, _, now = line.strip("|").partition(" | ")
            for option in OPTION.findall(old):
                became[option] = now.strip(" |")
    return became, range(start + 1, end + 1)


# --- the check


def problems(paths: list[Path], root: Path = REPO) -> list[str]:
    became, table_lines = removed_options()
    bare_ok = evald_options()
    found = []
    for path in paths:
        for snippet in snippets(path, root):
            for f in attribute(snippet):
                if f.file == "docs/configuration.md" and f.line in table_lines and f.option in became:
                    continue  # the table that says what became of it
                known = accepted(f.command) if f.command else bare_ok
                if known is None or f.option in known:
                    continue
                where = f"{f.file}:{f.line}: {f.option}"
                whom = f"`{f.command}`" if f.command else "evald (or any `evald SUBCOMMAND`)"
                if f.option in became:
                    found.append(f"{where}: an evald 0.1 option; now: {became[f.option]} "
                                 f"(docs/configuration.md, '{REMOVED_SECTION[3:]}')")
                else:
                    found.append(f"{where}: not an option of {whom}; `{f.command or 'evald'} --help` lists "
                                 f"what it accepts")
    return found


def test_every_option_the_docs_show_exists():
    found = problems(documents())
    assert not found, "options the docs show but the command refuses:\n" + "\n".join(found)


# --- the check itself can fail


def test_a_refused_option_is_reported_with_its_file_line_and_command(tmp_path):
    doc = tmp_path / "docs" / "new-page.md"
    doc.parent.mkdir()
    doc.write_text("Intro.\n\n```bash\nevald --device 7 --watch auto\nevald status --stepp 3\n"
                   "tensorboard --logdir x --whatever\n```\n\nSet `--baseline 0.5` or --frobnicate.\n")
    found = problems([doc], root=tmp_path)
    rel = "docs/new-page.md"
    assert found[0].startswith(f"{rel}:4: --watch: an evald 0.1 option; now: `--tuning` table")
    assert found[1] == (f"{rel}:5: --stepp: not an option of `evald status`; `evald status --help` lists what "
                        f"it accepts")
    assert found[2].startswith(f"{rel}:9: --baseline: an evald 0.1 option; now: removed")
    assert found[3].startswith(f"{rel}:9: --frobnicate: not an option of evald (or any `evald SUBCOMMAND`)")
    assert len(found) == 4, found  # tensorboard's options are not ours to judge


def test_commands_scripts_and_manifests_are_attributed():
    from evald.cli.main import SUBCOMMANDS

    line = Snippet("x.sh", 1, 'GLOG_v=3 taskset -c 2 .venv/bin/evald --ckpt-dir "$RUN" --patience 5 && '
                               "msrun --worker_num=4 examples/tiny_lm/train.py --every 5 --bogus")
    assert [(f.option, f.command) for f in attribute(line)] == [
        ("--ckpt-dir", "evald"), ("--patience", "evald"), ("--worker_num", "msrun (not ours)"),
        ("--every", "examples/tiny_lm/train.py"), ("--bogus", "examples/tiny_lm/train.py")]
    assert "--bogus" not in accepted("examples/tiny_lm/train.py")
    assert "--every" in accepted("examples/tiny_lm/train.py")
    assert {"status", "retry", "subset", "keys"} <= set(SUBCOMMANDS)
    assert "--step" in accepted("evald status") and "--step" not in accepted("evald")
    manifest = list(_yaml("m.yaml", 'spec:\n  command: ["evald", "--device", "0",\n'
                                    '            "--watch", "auto"]\n'))
    assert [(f.option, f.command) for s in manifest for f in attribute(s)] == [
        ("--device", "evald"), ("--watch", "evald")]
