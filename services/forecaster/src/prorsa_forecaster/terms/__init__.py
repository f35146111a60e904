"""The terms of the forecast (Appendix B), one module each, composed by
:func:`prorsa_forecaster.core.forecast`:

* :mod:`.sampler`: sampler with reward (B.2), announced sync batches included;
* :mod:`.sandbox`: sandbox start-up (B.3);
* :mod:`.ready`: the ready queue (B.4);
* :mod:`.tool`: tool execution (B.5) and the next turns of trajectories decoding or
  queued at t;
* :mod:`.inflight`: in-flight prefill (B.6);
* :mod:`.decode_admit`: decode admissions, the queue model (B.7), with
  :mod:`.known_queue` (the requests known at t) and :mod:`.prefill_queue` (the learnt
  prefill time and the FIFO scan);
* :mod:`.update`: a weight update that may land in the window (re-prefills, cut turns);
* :mod:`.correction`: online correction (B.8) and the blend with the naive predictors.

:mod:`.common` holds what they share: request loads per service class, delay kernels.
"""
