#!/bin/bash
# Exit 0: the task is solved.
set -e
test "$(tr "\n" " " < numbers.txt)" = "9 10 100 "
