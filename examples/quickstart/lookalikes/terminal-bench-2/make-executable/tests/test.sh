#!/bin/bash
# Exit 0: the task is solved.
set -e
test -x run.sh
test "$(./run.sh)" = ready
