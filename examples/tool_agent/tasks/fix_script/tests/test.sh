#!/bin/bash
# Hidden from the agent. Runs the script with two names, so a hard-coded greeting does not pass:
# 0 = missing or still failing, 0.5 = both runs exit 0 but a greeting is wrong, 1 = both greetings right.
mkdir -p /logs/verifier
script=/app/greet.sh
if [ ! -f "$script" ]; then
    echo "no $script"
    echo 0 > /logs/verifier/reward.txt
    exit 0
fi
ada="$(cd /tmp && timeout 10 bash "$script" Ada 2>&1)"; ada_rc=$?
world="$(cd /tmp && timeout 10 bash "$script" World 2>&1)"; world_rc=$?
echo "greet.sh Ada -> exit $ada_rc: ${ada:0:200}"
echo "greet.sh World -> exit $world_rc: ${world:0:200}"
if [ "$ada_rc" -ne 0 ] || [ "$world_rc" -ne 0 ]; then
    echo 0 > /logs/verifier/reward.txt
elif [ "$ada" = "Hello, Ada!" ] && [ "$world" = "Hello, World!" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0.5 > /logs/verifier/reward.txt
fi
