#!/bin/bash
# The oracle's answer (Harbor's `oracle` agent runs this): proves the verifier can give reward 1.
echo "Monopoly" > /app/answer.txt
