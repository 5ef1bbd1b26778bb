#!/bin/bash
# Reward 1 when the agent's answer names the hidden game, else 0. The agent never sees this file.
answer_file=/app/answer.txt
mkdir -p /logs/verifier
if [ ! -f "$answer_file" ]; then
    echo "no $answer_file: the agent wrote no answer"
    echo 0 > /logs/verifier/reward.txt
    exit 0
fi
echo "answer: $(head -c 200 "$answer_file")"
if tr '[:upper:]' '[:lower:]' < "$answer_file" | grep -q "monopoly"; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
