#!/bin/bash
# Exit 0: the task is solved.
set -e
test "$(cat hello.txt)" = "Hello, world!"
