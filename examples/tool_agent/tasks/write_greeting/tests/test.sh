#!/bin/bash
# Hidden from the agent (Harbor uploads it only after the agent ends).
# 0 = no /app/greeting.txt, 0.5 = it exists with other content, 1 = exactly "Hello, Loops!" (one trailing
# newline or none).
mkdir -p /logs/verifier
file=/app/greeting.txt
if [ ! -f "$file" ]; then
    echo "no $file"
    echo 0 > /logs/verifier/reward.txt
    exit 0
fi
echo "greeting.txt: $(head -c 200 "$file")"
if [ "$(cat "$file")" = "Hello, Loops!" ] && [ "$(wc -l < "$file")" -le 1 ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0.5 > /logs/verifier/reward.txt
fi
