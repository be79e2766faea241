from runner.cli import entry

raise SystemExit(entry())
