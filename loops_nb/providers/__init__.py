"""Environment backends (`[providers.<name>]`): local bubblewrap, Docker, Blaxel, Daytona.

`config` holds the tables, `adapters` what each backend needs and how its journalled sandboxes are
released; `local`, `blaxel` and `daytona` are the Harbor environment classes (they import Harbor and the
backend's SDK, so import them only when used).
"""

from loops_nb.providers.adapters import ProviderAdapter, provider_adapter
from loops_nb.providers.provider_tables import (
    BlaxelProviderConfig,
    DaytonaProviderConfig,
    DockerProviderConfig,
    LocalProviderConfig,
    ProviderConfig,
)

__all__ = [
    "BlaxelProviderConfig",
    "DaytonaProviderConfig",
    "DockerProviderConfig",
    "LocalProviderConfig",
    "ProviderAdapter",
    "ProviderConfig",
    "provider_adapter",
]
