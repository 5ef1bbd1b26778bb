"""The RL recipe: episodes on a runtime, exact token capture, GRPO, sync and async scheduling."""
