"""The ``deviceq workflow`` group: put, list, show stored workflow definitions."""

from __future__ import annotations

from typing import Any

import click

from ..core.errors import InvalidInput
from ..core.input_files import nesting_guard
from .app import workflow
from .context import Ctx, pass_ctx
from .render import console_for_tables, echo_json


def _load_definitions(text: str, source: str) -> list[dict[str, Any]]:
    import yaml

    try:
        with nesting_guard(source):
            data = yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise InvalidInput(f"{source}: not valid YAML or JSON: {first}") from None
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(x, dict) for x in items):
        raise InvalidInput(f"{source}: expected a workflow mapping (name, steps) or a list of them")
    return items


@workflow.command("put")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--json", "as_json", is_flag=True, help="Print the stored names as JSON.")
@pass_ctx
def workflow_put(ctx: Ctx, file: str, as_json: bool) -> None:
    """Store (or replace) workflow definitions from a YAML or JSON FILE ('-' for stdin): one
    mapping with `name`, optional `description` and `steps` (each a `goal`, optional `name`), or
    a list of them. All are validated before any is stored.

    \b
    Example:
      deviceq workflow put smoke.yaml
    \b
      # smoke.yaml
      name: smoke-suite
      steps:
        - {name: launch, goal: "open the app"}
        - {name: login, goal: "log in as the test user"}
    """
    from pydantic import ValidationError

    from ..core.models import WorkflowDefinition
    from .task_files import read_text

    items = _load_definitions(read_text(file), "<stdin>" if file == "-" else file)
    defs = []
    for i, item in enumerate(items, 1):
        try:
            defs.append(WorkflowDefinition.model_validate(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            what = f"workflow {i}" if len(items) > 1 else "workflow"
            raise InvalidInput(
                f"{file}: {what}: {where + ': ' if where else ''}"
                f"{str(err['msg']).removeprefix('Value error, ')}"
            ) from None
    names = [ctx.client.put_workflow(d) for d in defs]
    if as_json:
        echo_json([{"name": d.name, "steps": len(d.steps)} for d in defs])
    else:
        for d, name in zip(defs, names, strict=True):
            click.echo(f"stored workflow {name} ({len(d.steps)} steps)")


@workflow.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def workflow_list(ctx: Ctx, as_json: bool) -> None:
    """List stored workflows with their number of steps.

    \b
    Example:
      deviceq workflow list --json
    """
    from rich.table import Table

    names: list[str] = ctx.client.list_workflows()
    defs = [ctx.client.get_workflow(n) for n in names]
    if as_json:
        echo_json(
            [{"name": d.name, "description": d.description, "steps": len(d.steps)} for d in defs]
        )
        return
    table = Table()
    for col in ("name", "steps", "description"):
        table.add_column(col)
    for d in defs:
        table.add_row(d.name, str(len(d.steps)), d.description or "-")
    console_for_tables().print(table)


@workflow.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def workflow_show(ctx: Ctx, name: str, as_json: bool) -> None:
    """Print a stored workflow (YAML, or JSON with --json; either can be fed back to `put`).

    \b
    Example:
      deviceq workflow show smoke-suite > smoke.yaml
    """
    import yaml

    data = ctx.client.get_workflow(name).model_dump(mode="json", exclude_none=True)
    if as_json:
        echo_json(data)
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip())
