"""Prorsa client SDK: publish trajectory lifecycle events from an RL framework.

    from prorsa_sdk import Emitter, SyncEmitter
"""

from prorsa_runtime.publisher import BufferFull

from .emitter import Emitter, SyncEmitter

__all__ = ["BufferFull", "Emitter", "SyncEmitter"]
