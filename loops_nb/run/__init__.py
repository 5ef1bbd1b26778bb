"""The run skeleton both recipes share: `setup.run_recipe` sets a run up, `recipe_run.RecipeRun` steps,
checkpoints, resumes and ends it; a recipe supplies only how a step's data is produced, trained and logged.
"""
