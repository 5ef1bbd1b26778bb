"""Prime verifiers environments as a rollout runtime: `[runtime] factory = "loops_nb.verifiers:create_runtime"`.

Each attempt is one episode of the environment, run out of process in a verifiers interpreter the kit
builds (environment_build.py), its model calls through the run's gateway with the attempt's lease
(verifiers_runtime.py). docs/reference/verifiers.md says what is supported.
"""

from loops_nb.verifiers.options import VerifiersOptions
from loops_nb.verifiers.verifiers_runtime import VerifiersRuntime, create_runtime

__all__ = ["VerifiersOptions", "VerifiersRuntime", "create_runtime"]
