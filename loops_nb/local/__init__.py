"""The embedded Loops: a Loops-compatible control plane, LoRA trainer and sampler on this machine.

The real `baseten-loops` SDK drives it through `ServiceClient(base_url=...)`, so the code path that runs
locally is the one that runs on Baseten.
"""
