"""Prorsa client SDK: publish trajectory lifecycle events from an RL framework.

    from prorsa_sdk import Emitter, SyncEmitter                  # the events, one call each
    from prorsa_sdk import RolloutClient, SyncRolloutClient      # model calls that publish them

See docs/sdk.md and docs/integrations.md.
"""

from prorsa_runtime.publisher import BufferFull

from .client import RequestSpan, RewardSpan, RolloutClient, ToolSpan, Trajectory
from .emitter import Emitter, SyncEmitter
from .lifecycle import LifecycleError, TrajectoryCore
from .outcome import Outcome, ResponseError
from .sync_client import SyncRequestSpan, SyncRolloutClient, SyncTrajectory
from .wire import EngineAborted, EngineError, Generation

__version__ = "0.1.0"

__all__ = [
    "BufferFull",
    "Emitter",
    "EngineAborted",
    "EngineError",
    "Generation",
    "LifecycleError",
    "Outcome",
    "RequestSpan",
    "ResponseError",
    "RewardSpan",
    "RolloutClient",
    "SyncEmitter",
    "SyncRequestSpan",
    "SyncRolloutClient",
    "SyncTrajectory",
    "ToolSpan",
    "Trajectory",
    "TrajectoryCore",
]
