"""The bodies of kdt's commands, one module each; kdt/cli.py wires them into the Typer app."""
