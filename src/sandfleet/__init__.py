"""sandfleet: agentic RL rollouts in isolated sandboxes, and the capacity of the hosts that run them.

Importing this package is cheap: backends, the CLI and optional dependencies load lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
