"""The states of a trajectory's slot in the fold (:class:`~prorsa_forecaster.state.LiveState`),
shared with the snapshot builder and the window loop. FREE marks an unused slot."""

FREE, START, QUEUED, PREFILL, DECODE, TOOL, REWARD, ABORTED = range(8)
