"""Subcommands of the ckptrace CLI, one module each."""
