"""Checking `deviceq ...` command lines written in files (README sessions, compose services)
against the CLI without running them: each line's `deviceq` calls are cut out of the shell
around them (pipes, lists, redirections, `$(...)`) and parsed as the CLI would parse them."""

from __future__ import annotations

import re
import shlex

import click

from deviceq.cli import main

SAMPLE = "0123456789abcdef"  # what a shell variable or a `$(...)` stands for
OPERATORS = ("&&", "||", ";", "|", "&", ";;")
REDIRECTIONS = (">", ">>", "<", "2>", "2>>", "&>")


def check_cli(args: list[str]) -> click.Context:
    """Parse ``deviceq ARGS`` as the CLI would, without running it: unknown commands, unknown
    options, bad values and missing arguments raise click.UsageError."""

    def rest_of(c: click.Context) -> list[str]:
        return [*getattr(c, "_protected_args", []), *c.args]

    ctx = main.make_context("deviceq", list(args))
    cmd: click.Command = main
    rest = rest_of(ctx)
    while isinstance(cmd, click.Group):
        if not rest and cmd.invoke_without_command:  # a group that runs on its own (`api`)
            break
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        cmd, rest = sub, rest_of(ctx)
    assert not ctx.args, f"extra arguments {ctx.args}"
    return ctx


def strip_redirections(tokens: list[str]) -> list[str]:
    out, skip = [], False
    for tok in tokens:
        if skip:
            skip = False
        elif tok in REDIRECTIONS or re.fullmatch(r"\d?>+", tok):
            skip = True
        else:
            out.append(tok)
    return out


def deviceq_invocations(line: str, sample: str = SAMPLE) -> list[list[str]]:
    """The argument lists of every `deviceq ...` call in one shell command line, those inside
    `$(...)` included; shell variables and substitutions become ``sample``."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out: list[list[str]] = []
    _split(list(lex), sample, out)
    return out


def _split(tokens: list[str], sample: str, out: list[list[str]]) -> None:
    seg: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.endswith("$") and i + 1 < len(tokens) and tokens[i + 1] == "(":
            depth, j = 1, i + 2
            while j < len(tokens) and depth:
                depth += {"(": 1, ")": -1}.get(tokens[j], 0)
                j += 1
            _split(tokens[i + 2 : j - 1], sample, out)  # the substitution's own commands
            seg.append(tok[:-1] + sample)
            i = j
            continue
        if tok in OPERATORS:
            if seg and seg[0] == "deviceq":
                out.append(strip_redirections(seg[1:]))
            seg = []
        else:
            seg.append(re.sub(r"\$\{?(\w+|\?)\}?", sample, tok))
        i += 1
    if seg and seg[0] == "deviceq":
        out.append(strip_redirections(seg[1:]))
