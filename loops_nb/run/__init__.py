"""The run skeleton both recipes share: set a run up, step it, checkpoint it, resume it, end it.

`setup.run_recipe` owns everything before the first step (run directory, lock, config drift, run.json,
observers, the Loops connection, a finished run answered from its files); `recipe_run.RecipeRun` owns the
step loop (resume, stop, failure -> `RunFailed`, checkpoint cadence, the final checkpoint, `Outcome`). A
recipe supplies only what differs: how a step's data is produced and trained, and what it logs.
"""
