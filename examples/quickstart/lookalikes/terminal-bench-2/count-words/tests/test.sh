#!/bin/bash
# Exit 0: the task is solved.
set -e
test -f words.txt
test "$(tr -d " \n" < count.txt)" = "$(wc -w < words.txt | tr -d " ")"
