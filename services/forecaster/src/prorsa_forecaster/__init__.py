"""Prorsa forecaster: short-horizon prefill demand and decode admissions (paper Appendix B).

Public API:

* :func:`prorsa_forecaster.core.forecast` ``(snapshot, history, config) -> Forecast`` (pure)
* :class:`prorsa_forecaster.snapshot.Snapshot`, :class:`~prorsa_forecaster.snapshot.RunInfo`
* :class:`prorsa_forecaster.state.LiveState` (events -> snapshot + history)
* :class:`prorsa_forecaster.windows.WindowLoop` / :func:`~prorsa_forecaster.windows.replay`
* :func:`prorsa_forecaster.evaluate.evaluate_log` (what ``prorsa forecast-eval`` runs)
* :class:`prorsa_forecaster.service.Forecaster` (the JetStream service)
"""
