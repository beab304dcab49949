"""How `--help` reads: a value is named by what it is (`--param NAME=VALUE`, `RUN`), never
by the Python type Typer would print (`<list[str]>`, `<int>`); and `roadie --help` lists
the commands under headings, in the order an operator meets them.

Typer builds every command with the classes here (`main.py` hands them out); they import
nothing but Typer, so help stays as quick as it was."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    # Typer's own Click, which it does not re-export.
    from typer._click.core import Command as ClickCommand
    from typer._click.core import Context
    from typer._click.formatting import HelpFormatter


def name_values(command: ClickCommand) -> None:
    """Give each option of `command` that takes a value and names none a metavar: its
    name in capitals (`--member MEMBER`), as argparse does. Typer would show the Python
    type instead (`--member <str>`)."""
    for param in command.params:
        takes_value = not getattr(param, "is_flag", False) and not getattr(param, "count", False)
        if param.param_type_name == "option" and takes_value and param.metavar is None and param.name:
            param.metavar = param.name.upper()


def format_params(command: ClickCommand, ctx: Context, formatter: HelpFormatter) -> None:
    """The Arguments and Options sections, as Typer writes them, except that an argument is
    shown by its metavar alone (Typer adds its Python type: `RUN <int>`)."""
    arguments, options = [], []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        if param.param_type_name == "argument":
            arguments.append((param.metavar or (param.name or "").upper(), record[1]))
        else:
            options.append(record)
    for title, rows in (("Arguments", arguments), ("Options", options)):
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


class Command(TyperCommand):
    """A command whose help names each value by what it is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        name_values(self)

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        format_params(self, ctx, formatter)


class Group(TyperGroup):
    """A group of commands whose help names each value by what it is, and lists its commands
    under the headings of `sections`, in their order; a command named in none is listed
    last, under "Commands". With no sections, all are under "Commands", as they were added."""

    sections: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        name_values(self)

    def list_commands(self, ctx: Context) -> list[str]:
        placed = [name for _, names in self.sections for name in names if name in self.commands]
        return placed + [name for name in self.commands if name not in placed]

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        format_params(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        shown = [name for name in self.list_commands(ctx) if not self.commands[name].hidden]
        if not shown:
            return
        # One width for every heading's names, so the descriptions line up down the page.
        width = max(len(name) for name in shown)
        limit = formatter.width - 6 - width
        headed = [(title, [n for n in names if n in shown]) for title, names in self.sections]
        rest = [n for n in shown if not any(n in names for _, names in headed)]
        for title, names in [*headed, ("Commands", rest)]:
            if names:
                with formatter.section(title):
                    formatter.write_dl(
                        [(name.ljust(width), self.commands[name].get_short_help_str(limit)) for name in names]
                    )
