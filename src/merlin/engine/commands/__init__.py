"""merlin-cli's subcommands, one module each (engine/cli.py dispatches; args.py is shared)."""
