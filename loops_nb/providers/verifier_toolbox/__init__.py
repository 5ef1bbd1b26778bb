"""Stand-ins for the tools Harbor's standard `tests/test.sh` installs over the network (see toolbox.py)."""
