"""The model client: `LoopsLLM` (what agents call), the chat renderer and exact token capture."""
