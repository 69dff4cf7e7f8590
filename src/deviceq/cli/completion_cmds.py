"""``deviceq completion bash|zsh|fish``: print the shell's tab-completion script (click's)."""

from __future__ import annotations

import click

from .app import main

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_DEVICEQ_COMPLETE"


@main.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the tab-completion script for SHELL (commands, options, choices).

    \b
    Examples:
      deviceq completion bash > ~/.local/share/bash-completion/completions/deviceq
      deviceq completion zsh > "${fpath[1]}/_deviceq"
      deviceq completion fish > ~/.config/fish/completions/deviceq.fish
      eval "$(deviceq completion bash)"      # this shell only
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    if cls is None:  # click knows every shell in SHELLS
        raise click.UsageError(f"no completion for {shell}")
    click.echo(cls(main, {}, "deviceq", COMPLETE_VAR).source())
