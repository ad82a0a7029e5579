#!/bin/bash
printf 'prefix-one\nprefix-two\n' > /app/prefix.txt
mkdir -p /app/children && echo solution > /app/children/c0
echo 42 > /app/answer.txt
