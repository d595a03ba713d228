"""`--help` in the CLI's language: the click command and group classes every `tally` command is
made with, whose help is translated when it is formatted, not when the module is imported
($TALLY_LANG is read when the command runs).

What passes through the catalog (`tally.language`): a command's help text (its docstring after
`inspect.cleandoc`, up to a form feed — that is the msgid), its short help in a group's list
(the first sentence of the translated text), its epilog, every option's help, and click's own
words around them (`Usage:`, `Options`, `Commands`, `[default: …; env var: …; required]`).
Importing this module also points click's own messages at the catalog (`tally.cli.click_words`):
every command is made with these classes, so click's errors speak the help's language.
Option names, metavars, choices, defaults and command names stay as they are.

`extract_help` is the Babel extraction method `babel.cfg` names for `tally/cli/`: besides the
`_()` messages it yields every help text those files write (the docstrings of functions
decorated as commands and the `help=`/`short_help=`/`epilog=` literals), so
`pybabel extract -F babel.cfg` finds all of them; `tests/unit/test_cli_language.py` walks the
command tree and fails on a help text the catalog lacks.
"""

from __future__ import annotations

import ast
import inspect
import io
from collections.abc import Collection, Iterator, Mapping
from typing import IO, Any

import click

from tally.cli import click_words
from tally.language import EN, _, language, translate

SHORT_HELP_LIMIT = 45

click_words.install()  # click's own errors and words in the same language as the help


def help_text(text: str | None) -> str:
    """A command's help as its msgid: dedented, up to the first form feed."""
    return inspect.cleandoc(text or "").partition("\f")[0]


def short_help(command: click.Command, limit: int = SHORT_HELP_LIMIT) -> str:
    """A command's line in its group's list, in the CLI's language."""
    if command.short_help:
        return translate(inspect.cleandoc(command.short_help))
    text = help_text(command.help)
    if not text:
        return ""
    if language() == EN:
        return click.utils.make_default_short_help(text, limit)
    said = translate(text)
    first = said.split("\n\n")[0].replace("\n", "")
    sentence, stop, _rest = first.partition("。")
    width = limit // 2  # a Chinese character takes two terminal columns
    return sentence + stop if len(sentence) <= width else sentence[: width - 1] + "…"


def help_record(param: click.Parameter, ctx: click.Context) -> tuple[str, str] | None:
    """An option's row in the Options list with its help and click's notes translated."""
    record = param.get_help_record(ctx)
    if record is None or not isinstance(param, click.Option):
        return record
    extra = param.get_help_extra(ctx)
    notes = []
    if "envvars" in extra:
        notes.append(_("env var: {var}").format(var=", ".join(extra["envvars"])))
    if "default" in extra:
        notes.append(_("default: {default}").format(default=extra["default"]))
    if "range" in extra:
        notes.append(extra["range"])
    if "required" in extra:
        notes.append(_("required"))
    said = translate(param.help) if param.help else ""
    if notes:
        said = f"{said}  [{'; '.join(notes)}]" if said else f"[{'; '.join(notes)}]"
    return record[0], said


HELP_OPTION_HELP = "Show this message and exit."  # click's msgid, said by `help_record`


class Command(click.Command):
    """A `tally` command whose help speaks the CLI's language."""

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        # click makes the `--help` option once per command and keeps it, with its help said in
        # the language of that first run; its msgid keeps a later run's help in its own language
        option = super().get_help_option(ctx)
        if option is not None:
            option.help = HELP_OPTION_HELP
        return option

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        pieces = self.collect_usage_pieces(ctx)
        formatter.write_usage(ctx.command_path, " ".join(pieces), _("Usage:") + " ")

    def get_short_help_str(self, limit: int = SHORT_HELP_LIMIT) -> str:
        return short_help(self, limit)

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        text = help_text(self.help)
        if text:
            formatter.write_paragraph()
            with formatter.indentation():
                formatter.write_text(translate(text))

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [r for p in self.get_params(ctx) if (r := help_record(p, ctx)) is not None]
        if rows:
            with formatter.section(_("Options")):
                formatter.write_dl(rows)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.epilog:
            formatter.write_paragraph()
            with formatter.indentation():
                formatter.write_text(translate(inspect.cleandoc(self.epilog)))


class Group(Command, click.Group):
    """A `tally` command group: its help, and its subcommands made as `Command`/`Group`."""

    command_class = Command
    group_class = type  # a subgroup is of the group's own class

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        Command.format_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        commands = [
            (name, command)
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        if not commands:
            return
        limit = formatter.width - 6 - max(len(name) for name, _c in commands)
        rows = [(name, command.get_short_help_str(limit)) for name, command in commands]
        with formatter.section(_("Commands")):
            formatter.write_dl(rows)


# ------------------------------------------------------------------------------ extraction

_HELP_KEYWORDS = ("help", "short_help", "epilog")


def _decorated_as_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        call = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(call, ast.Attribute) and call.attr in ("command", "group"):
            return True
    return False


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def help_messages(source: str) -> Iterator[tuple[int, str]]:
    """(line, msgid) of every help text written in `source`: command docstrings, the `help=`,
    `short_help=` and `epilog=` string literals, and the values of a `…_HELP` dict literal."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc and _decorated_as_command(node):
                yield node.lineno, help_text(doc)
        elif isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.endswith("_HELP") for t in targets):
                for value in node.value.values:
                    if (text := _literal(value)) is not None:
                        yield value.lineno, inspect.cleandoc(text)
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                text = _literal(keyword.value) if keyword.arg in _HELP_KEYWORDS else None
                if text:
                    yield keyword.value.lineno, inspect.cleandoc(text)


def extract_help(
    fileobj: IO[bytes],
    keywords: Mapping[str, Any],
    comment_tags: Collection[str],
    options: Any,
) -> Iterator[tuple[Any, ...]]:
    """Babel extraction method: the `_()` messages (Babel's Python extractor) and the help
    texts (`help_messages`) of a `tally/cli` module, as (line, function, message, comments)."""
    from babel.messages.extract import extract_python  # build tooling: not on the CLI's path

    source = fileobj.read()
    yield from extract_python(io.BytesIO(source), keywords, comment_tags, options)
    for line, message in help_messages(source.decode(options.get("encoding", "utf-8"))):
        yield line, None, message, []
