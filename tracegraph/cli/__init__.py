"""The command line: `app` assembles one module per command."""
