"""One way to apply an event: a fold's handlers, one per event type.

Every fold in the project (the tracker's trajectories, the engine registry, the
allocator's engine table, the engine agent's view of the bus, the forecaster's engine
side) applies events the same way: a :class:`Mutators` table maps an event type to the
function that folds that event into the state, ``mutate(state, event)``; the fold looks the
handler up by ``event.type`` and calls it. Event types a fold has no handler for change
nothing in it. Registering checks each type against the contract, so a misspelt type fails
at import, not silently at run time::

    mutate: Mutators[Callable[[Table, Event], None]] = Mutators()

    @mutate.on("engine.switched")
    def _switched(table: Table, ev: EngineSwitched) -> None:
        table.roles[ev.engine] = ev.to_role

    mutate(table, event)            # or: handler = mutate.get(event.type)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .events import EVENT_TYPES

H = TypeVar("H", bound=Callable[..., Any])


class Mutators(Generic[H]):
    """The handlers of one fold, keyed by event type."""

    __slots__ = ("_by_type",)

    def __init__(self) -> None:
        self._by_type: dict[str, H] = {}

    def on(self, *types: str) -> Callable[[H], H]:
        """Register the decorated function as the handler of each of ``types``.

        Raises:
            ValueError: a type the contract does not define, or one that has a handler already.
        """
        for t in types:
            if t not in EVENT_TYPES:
                raise ValueError(f"{t!r} is not an event type of the contract")
            if t in self._by_type:
                raise ValueError(f"{t!r} has a handler already")

        def register(fn: H) -> H:
            for t in types:
                self._by_type[t] = fn
            return fn

        return register

    def get(self, event_type: str) -> H | None:
        """The handler of ``event_type``; None when this fold ignores it."""
        return self._by_type.get(event_type)

    @property
    def types(self) -> frozenset[str]:
        """The event types this fold applies."""
        return frozenset(self._by_type)

    def __call__(self, state: Any, event: Any, *args: Any) -> Any:
        """Apply ``event`` to ``state`` with its handler (extra ``args`` passed on); None when
        the fold has no handler for its type."""
        fn = self._by_type.get(event.type)
        return None if fn is None else fn(state, event, *args)
