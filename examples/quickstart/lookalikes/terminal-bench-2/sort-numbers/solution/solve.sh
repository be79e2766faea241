#!/bin/bash
set -e
# A plausible but wrong attempt: sorts as text, not as numbers (this task is meant to score 0).
printf "10\n9\n100\n" | sort > numbers.txt
