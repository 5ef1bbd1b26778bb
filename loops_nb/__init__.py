"""loops_nb."""
