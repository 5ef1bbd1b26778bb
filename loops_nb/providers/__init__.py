"""Environment backends (`[providers.<name>]`): local bubblewrap, Docker, Blaxel, Daytona.

`provider_config` holds the tables, `adapters` what each backend needs and how its journalled sandboxes are
released; `local`, `blaxel` and `daytona` are the Harbor environment classes (they import Harbor and the
backend's SDK, so import them only when used).
"""
