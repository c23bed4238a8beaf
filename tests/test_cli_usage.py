"""The three command lines (python -m ops, python -m models, python -m driver) as a new user meets
them: a missing or unknown command is reported the same way by each (one `error:` line naming the
program, with its usage, exit status 2), and `--help` explains every option of every command."""

from __future__ import annotations

import argparse

import pytest

from driver.cli import build_parser as driver_parser
from driver.cli import main as driver_main
from models.__main__ import _parser as models_parser
from models.__main__ import main as models_main
from ops.__main__ import _parser as ops_parser
from ops.__main__ import main as ops_main

CLIS = {  # program: (main, parser, its commands)
    "python -m ops": (ops_main, ops_parser, {"info", "library-path", "rewrite"}),
    "python -m models": (models_main, models_parser,
                         {"build", "convert", "acceptance", "sweep", "head-folder", "train", "tokenizer"}),
    "python -m driver": (driver_main, driver_parser, {"generate", "identity"}),
}


def usage_error(capsys, main, argv) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("prog", CLIS)
def test_a_missing_or_unknown_command_is_one_line_with_the_usage(capsys, prog):
    main, _, commands = CLIS[prog]
    missing = usage_error(capsys, main, [])
    assert missing.startswith(f"error: {prog}: the following arguments are required: command (usage: {prog} ")
    unknown = usage_error(capsys, main, ["frobnicate"])
    assert unknown.startswith(f"error: {prog}: argument command: invalid choice: 'frobnicate'")
    for line in (missing, unknown):
        usage = line[line.index("(usage: "):]
        assert all(command in usage for command in commands), line


@pytest.mark.parametrize("prog, argv, fragment", [
    ("python -m ops", ["rewrite"], "the following arguments are required: IN, OUT"),
    ("python -m models", ["build", "--out", "x"], "the following arguments are required: --preset"),
    ("python -m driver", ["generate", "--prompt", "x", "--max-new-tokens", "many"],
     "argument --max-new-tokens: invalid int value: 'many'"),
])
def test_a_bad_option_names_the_command_and_carries_its_usage(capsys, prog, argv, fragment):
    line = usage_error(capsys, CLIS[prog][0], argv)
    command = f"{prog} {argv[0]}"
    assert line.startswith(f"error: {command}: {fragment} (usage: {command} [-h] ") and line.endswith(")"), line


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("prog", CLIS)
def test_every_option_of_every_command_has_help(prog):
    _, parser, names = CLIS[prog]
    found = commands(parser())
    assert set(found) == names
    for name, command in found.items():
        undocumented = [a.dest for a in command._actions if not a.help or a.help == argparse.SUPPRESS]
        assert undocumented == [], f"{prog} {name}: options without help: {undocumented}"
        text = command.format_help()  # what `PROG NAME --help` prints
        for action in command._actions:
            assert " ".join(action.help.split()[:3]) in " ".join(text.split()), (name, action.dest)


@pytest.mark.parametrize("prog", CLIS)
def test_help_exits_0_and_lists_the_commands(capsys, prog):
    main, _, names = CLIS[prog]
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog} ") and all(name in out for name in names)
