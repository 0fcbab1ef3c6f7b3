"""The ``agentcredit`` command line. Commands stay thin: each parses options and calls library code."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="agentcredit",
    help="RL for tool-using LLM agents with fine-grained credit assignment.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def main() -> None:
    """agentcredit: train, evaluate and compare credit-assignment methods for tool-using agents."""


if __name__ == "__main__":
    app()
