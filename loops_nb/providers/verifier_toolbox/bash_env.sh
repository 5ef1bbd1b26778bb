# BASH_ENV of the local sandbox's verifier: a command the verifier's own scripts (under /tests) cannot find
# is reported as the verifier's problem, not the tests'. Scripts the tests run elsewhere (the agent's) are
# left alone: their missing command is the agent's business.
if [ -n "$LOOPS_NB_VERIFIER_PROBLEMS" ] && [[ "$0" == /tests/* ]]; then
    command_not_found_handle() {
        printf 'missing command: %s is not on this host (run by %s)\n' "$1" "$0" >>"$LOOPS_NB_VERIFIER_PROBLEMS"
        printf '%s: %s: command not found\n' "$0" "$1" >&2
        return 127
    }
fi
