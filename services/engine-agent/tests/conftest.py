"""Makes the engine agent's test harness importable and registers its fixtures."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from agent_harness import agent_factory, events, router  # noqa: E402,F401
