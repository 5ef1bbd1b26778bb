#!/bin/bash
# Hidden from the agent. 0 = no /app/answer.txt, 0.5 = an answer that is not the line count, 1 = the count.
# The expected count is fixed here, so editing inventory.txt does not change the right answer.
mkdir -p /logs/verifier
expected=23
file=/app/answer.txt
if [ ! -s "$file" ]; then
    echo "no answer in $file"
    echo 0 > /logs/verifier/reward.txt
    exit 0
fi
answer="$(tr -d '[:space:]' < "$file")"
echo "answer: ${answer:0:200} (expected $expected)"
if [ "$answer" = "$expected" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0.5 > /logs/verifier/reward.txt
fi
