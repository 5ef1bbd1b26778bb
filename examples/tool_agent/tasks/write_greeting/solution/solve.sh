#!/bin/bash
# The oracle's answer (Harbor's `oracle` agent runs this): proves the verifier can give reward 1.
printf 'Hello, Loops!\n' > /app/greeting.txt
