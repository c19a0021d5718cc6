"""mkdocs hook: the CLI reference (docs/cli.md) is generated from the click definitions at build time, so it
cannot drift from ``npufix --help``. The page holds MARKER; this hook replaces it with the examples and every
option, in the groups --help shows them in. tests/test_docs.py checks that every option appears."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- npufix-options: generated from onnx_npu_fix/cli.py by docs/hooks.py -->"
PAGE = "cli.md"


def _cell(text: str) -> str:
    """Text for a markdown list item: one line, nothing markdown would read as markup."""
    return " ".join(text.split()).replace("<", "&lt;").replace("*", "\\*").replace("_", "\\_")


def options_markdown() -> str:
    """The examples and the options of ``npufix``, grouped as --help groups them, as markdown."""
    import click

    from onnx_npu_fix import cli

    ctx = click.Context(cli.main, info_name="npufix")
    lines = ["## Examples", ""]
    for command, what in cli.EXAMPLES:
        lines += [f"- `{command}`  ", f"  {_cell(what)}"]
    lines.append("")  # (the exit codes are a table further down the page)
    groups: dict[str, list[str]] = {group: [] for group in cli.OPTION_GROUPS}
    for param in cli.main.get_params(ctx):
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if record is not None:
            names, text = record
            groups[getattr(param, "group", cli.OUTPUT)].append(f"- `{names}`  \n  {_cell(text)}")
    for group, items in groups.items():
        lines += [f"## {group}", "", *items, ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its marker {MARKER!r}: the CLI reference would not be generated")
    return markdown.replace(MARKER, options_markdown())
