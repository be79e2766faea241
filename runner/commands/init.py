"""`runner init [-f FILE] [--force]`: write a commented starter pipeline that validates and applies as it is."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from runner.commands import EXIT_OK, UsageError

STARTER = """\
# A runner pipeline: ordered, idempotent steps. `runner plan` says what would run and why; `runner apply` runs
# only what is missing or stale, and after a failure you fix it and apply again: it resumes.
#
#   runner plan             # what would run, and why
#   runner apply            # do it; again: everything is ok, nothing runs
#   runner status           # each step's last result
#   runner explain prep     # one step's full reasoning
#
# Every string may be a template: {{ vars.X }}, {{ env.X }} (what env steps export), {{ steps.NAME.OUTPUT }}.
# The kinds and their fields: docs/steps.md in runner's repository, or `runner schema -o pipeline.schema.json`
# and a first line `# yaml-language-server: $schema=pipeline.schema.json` for your editor.
name: starter
vars:
  work: .work                 # what this pipeline makes, relative to this file
  items: "alpha,beta"         # `runner apply --var items=alpha,beta,gamma` adds an item; only it runs

# Keys starting `x-` are ignored: a place to keep YAML anchors shared by several steps (`<<: *retry`).
x-retry: &retry
  retries: 2                  # a failed attempt is tried again, up to 2 more times
  timeout: 600                # seconds; the step fails (and its processes are stopped) after that

steps:
  # Fail fast, with the fix, before anything slow starts.
  - name: tools
    assert:
      program: [git, python3]
      message: "git and python3 must be on PATH"

  # Settings every later step sees in its environment; `eval "$(runner env)"` gives them to your shell.
  - name: settings
    env:
      DATA_DIR: "{{ vars.work }}/data"

  # One step per item; `creates` makes it idempotent: done while its file exists and its spec is unchanged.
  - name: prep
    for_each: "{{ vars.items }}"
    <<: *retry
    run:
      command: "mkdir -p $DATA_DIR && echo {{ item }} > $DATA_DIR/{{ item }}.txt"
      creates: ["{{ vars.work }}/data/{{ item }}.txt"]

  # `needs` names what a step reads: it re-runs when prep changes. Without it, a step only comes after the
  # steps above it (file order orders; it does not re-run anything).
  - name: count
    needs: [prep]
    run:
      command: "cat $DATA_DIR/*.txt | wc -l"

  # Outputs of earlier steps are templates too.
  - name: report
    run:
      command: "echo {{ steps.count.stdout }} items prepared > {{ vars.work }}/report.txt"
      creates: ["{{ vars.work }}/report.txt"]

  # A long-running job: `detach: true` keeps it running after apply; `runner logs train -f` follows it,
  # `runner stop train` stops it, `runner down` removes what the pipeline runs.
  # - name: train
  #   launch:
  #     detach: true
  #     command: "python train.py --data {{ vars.work }}/data"
"""


def run(args: argparse.Namespace) -> int:
    target = Path(args.file)
    if target.exists() and not args.force:
        raise UsageError(f"{target} exists: runner init never overwrites a pipeline (--force replaces it)")
    if target.is_dir():
        raise UsageError(f"{target} is a directory")
    if not target.parent.is_dir():
        raise UsageError(f"{target.parent} is not a directory")
    partial = target.with_name(f".{target.name}.init-{os.getpid()}")
    partial.write_text(STARTER, encoding="utf-8")
    os.replace(partial, target)
    print(f"wrote {target}: a starter pipeline; `runner plan{_file_option(target)}` says what it would do")
    return EXIT_OK


def _file_option(target: Path) -> str:
    return "" if str(target) == "pipeline.yaml" else f" -f {target}"
