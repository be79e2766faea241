#!/bin/bash
set -e
printf "one two three\nfour five\n" > words.txt
wc -w < words.txt | tr -d " " > count.txt
