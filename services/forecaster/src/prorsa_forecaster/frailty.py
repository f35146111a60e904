"""Shared frailty of tool durations: a GRPO group's and a trajectory's own speed.

The trajectories of one GRPO group run in one environment (one repository and its test
suite, one set of tool servers), and each trajectory in its own sandbox, so their tool
calls are not independent draws: a group whose test suite takes a minute takes a minute
call after call. In a chat service the same holds for a conversation's user, who reads
and writes at their own pace. The forecaster models it as an accelerated failure time
with random effects, the textbook shared-frailty model of survival analysis:

    log T = mu + g + u + e

``g`` the group's effect, ``u`` the trajectory's own, ``e`` the call's noise, with
variances sigma_G^2, sigma_T^2 and sigma_W^2. ``T exp(-(g + u))`` then follows one
baseline distribution (``History.tool_base``), learnt non-parametrically like every other
duration (:class:`~prorsa_forecaster.survival.DurationModel`); an open call of elapsed
``e`` whose effects are ``theta = g + u`` returns within ``[e, e + S)`` with the
baseline's ``Pr(T0 < (e+S) exp(-theta) | T0 > e exp(-theta))``.

The effects are not known; they are estimated from the calls each group and trajectory
have finished, shrunk towards 0 by their variances (the best linear unbiased predictor of
a random effect): with ``n`` calls of mean residual ``r``,

    g_hat = r_group n_g / (n_g + s_within_group^2 / sigma_G^2)
    u_hat = (r_traj - g_hat) n_t / (n_t + sigma_W^2 / sigma_T^2)

The variances are the one-way random-effects ANOVA estimates (unbalanced, method of
moments), once over groups and once over trajectories (sigma_T^2 is the trajectories'
between variance less the groups'), kept as running totals so that each observation is
O(1): where durations do not cluster, the between variances come out at 0 and every
effect is 0, so that the baseline is the pooled distribution again. A log without the
optional ``trajectory.dispatched.group`` has the trajectory level only.

The totals count every call since the start (CHOICE: how much of the spread is shared
is a property of the workload, steadier than the durations themselves, which forget
over ``duration_half_life`` calls).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Effects are clipped to +-THETA_MAX (log units, a factor of e^2 = 7.4 either way; CHOICE:
# past it a trajectory's calls say more about a broken sandbox than about a speed).
THETA_MAX = 2.0
# Quantum of the effects in a window's query (log units: a 5% step in time scale, about
# the duration grid's 2% elapsed buckets' order, CHOICE): calls of one quantum share one
# table of conditional probabilities.
THETA_STEP = 0.05
# Shortest duration whose log is taken (seconds): a duration of 0 has no log.
MIN_DURATION_S = 1e-3


@dataclass(frozen=True, slots=True)
class Components:
    """The frailty's estimates: the grand mean of log durations, the variances of the
    trajectory and group effects (0: none), and their shrinkage pseudo-counts
    sigma_W^2 / sigma_T^2 and (within group) / sigma_G^2."""

    mu: float
    var_t: float
    var_g: float
    k_t: float
    k_g: float


class _Anova:
    """Running totals of a one-way random-effects ANOVA over units (groups or
    trajectories) whose observations arrive one at a time."""

    __slots__ = ("n", "total", "squares", "units", "unit_sq_over_n", "unit_n_sq")

    def __init__(self) -> None:
        self.n = 0  # observations
        self.total = 0.0  # sum y
        self.squares = 0.0  # sum y^2
        self.units = 0  # units with an observation
        self.unit_sq_over_n = 0.0  # sum over units of S_u^2 / n_u
        self.unit_n_sq = 0.0  # sum over units of n_u^2

    def add(self, y: float, n_u: int, s_u: float) -> None:
        """One observation ``y`` of a unit that had ``n_u`` observations summing to ``s_u``."""
        self.n += 1
        self.total += y
        self.squares += y * y
        if n_u > 0:
            self.unit_sq_over_n -= s_u * s_u / n_u
            self.unit_n_sq -= n_u * n_u
        else:
            self.units += 1
        self.unit_sq_over_n += (s_u + y) ** 2 / (n_u + 1)
        self.unit_n_sq += (n_u + 1) ** 2

    def variances(self) -> tuple[float, float]:
        """``(within, between)``: the variance of an observation about its unit's mean,
        and of the units' effects (0 where the moments say none)."""
        n, k = self.n, self.units
        if n - k < 1 or k < 2:
            return math.nan, 0.0
        within = max(self.squares - self.unit_sq_over_n, 0.0) / (n - k)
        between_ms = max(self.unit_sq_over_n - self.total * self.total / n, 0.0) / (k - 1)
        n0 = (n - self.unit_n_sq / n) / (k - 1)
        if n0 <= 0:
            return within, 0.0
        return within, max((between_ms - within) / n0, 0.0)


class Frailty:
    """The group and trajectory effects on tool durations (see the module docstring).

    Groups are held here, by a code that :meth:`group_code` hands out; a trajectory's
    own calls (count and sum of log durations) live in the caller's slot arrays and are
    passed in, so that a window's effects are one vectorised expression."""

    def __init__(self, min_calls: int = 200) -> None:
        self.min_calls = int(min_calls)
        self._traj = _Anova()
        self._group = _Anova()
        self._codes: dict[tuple[str, object], int] = {}
        self._members: list[int] = []
        self._free: list[int] = []
        self.group_n = np.zeros(64, np.int64)
        self.group_sum = np.zeros(64)
        self._cached: tuple[float, float, float, float] | None = None

    # -- groups -------------------------------------------------------------------------
    def group_code(self, run: str, group) -> int:
        """The code of a live group (allocated at its first member), -1 for None."""
        if group is None:
            return -1
        key = (run, group)
        code = self._codes.get(key)
        if code is None:
            if self._free:
                code = self._free.pop()
            else:
                code = len(self._members)
                self._members.append(0)
                if code >= len(self.group_n):
                    self.group_n = np.concatenate((self.group_n, np.zeros_like(self.group_n)))
                    self.group_sum = np.concatenate((self.group_sum, np.zeros_like(self.group_sum)))
            self._codes[key] = code
            self.group_n[code] = 0
            self.group_sum[code] = 0.0
        self._members[code] += 1
        return code

    def leave(self, run: str, group, code: int) -> None:
        """A member of group ``code`` ended; the group's code is freed with its last."""
        if code < 0:
            return
        self._members[code] -= 1
        if self._members[code] <= 0:
            self._codes.pop((run, group), None)
            self._free.append(code)

    # -- learning -----------------------------------------------------------------------
    @staticmethod
    def log_duration(duration: float) -> float:
        return math.log(max(float(duration), MIN_DURATION_S))

    def observe(self, y: float, traj_n: int, traj_sum: float, group: int) -> None:
        """One finished call: ``y`` its log duration, ``traj_n`` / ``traj_sum`` its
        trajectory's calls before it, ``group`` its group's code (-1: none)."""
        if not math.isfinite(y):
            return
        self._traj.add(y, traj_n, traj_sum)
        if group >= 0:
            self._group.add(y, int(self.group_n[group]), float(self.group_sum[group]))
            self.group_n[group] += 1
            self.group_sum[group] += y
        self._cached = None

    @property
    def calls(self) -> int:
        return self._traj.n

    def components(self) -> Components:
        """The grand mean and the effects' variances and shrinkage pseudo-counts (all
        variances 0 before ``min_calls`` calls, and where durations do not cluster)."""
        if self._cached is not None:
            return self._cached
        inf = math.inf
        if self._traj.n < self.min_calls:
            self._cached = Components(0.0, 0.0, 0.0, inf, inf)
            return self._cached
        mu = self._traj.total / self._traj.n
        within, between = self._traj.variances()
        g_within, g_between = self._group.variances() if self._group.n >= self.min_calls else (math.nan, 0.0)
        t_between = max(between - g_between, 0.0)
        k_t = within / t_between if t_between > 0 and math.isfinite(within) else inf
        k_g = g_within / g_between if g_between > 0 and math.isfinite(g_within) else inf
        self._cached = Components(mu, t_between if math.isfinite(k_t) else 0.0, g_between if math.isfinite(k_g) else 0.0,
                                  k_t, k_g)
        return self._cached

    @property
    def active(self) -> bool:
        """Whether the durations cluster by group or trajectory (some effect is not 0)."""
        c = self.components()
        return c.var_t + c.var_g > 0

    def effects(self, traj_n: np.ndarray, traj_sum: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(theta, variance)``, vectorised: the effects g_hat + u_hat (log units) of
        trajectories with ``traj_n`` ended calls summing to ``traj_sum`` in groups
        ``group`` (-1: none), and the variance of their error (a group or trajectory
        with no call yet: its whole effect's variance; less with each call)."""
        c = self.components()
        n_t = np.asarray(traj_n, dtype=float)
        if c.var_t + c.var_g <= 0:
            return np.zeros(n_t.shape), np.zeros(n_t.shape)
        g = np.asarray(group, dtype=np.int64)
        has = g >= 0
        n_g = np.where(has, self.group_n[np.maximum(g, 0)], 0).astype(float)
        s_g = np.where(has, self.group_sum[np.maximum(g, 0)], 0.0)
        zero = np.zeros(n_t.shape)
        with np.errstate(invalid="ignore", divide="ignore"):
            r_g = np.where(n_g > 0, s_g / np.maximum(n_g, 1.0) - c.mu, 0.0)
            g_hat = r_g * n_g / (n_g + c.k_g) if c.var_g > 0 else zero
            r_t = np.where(n_t > 0, np.asarray(traj_sum, dtype=float) / np.maximum(n_t, 1.0) - c.mu - g_hat, 0.0)
            u_hat = r_t * n_t / (n_t + c.k_t) if c.var_t > 0 else zero
            var = (c.var_g * c.k_g / (n_g + c.k_g) if c.var_g > 0 else zero) + \
                (c.var_t * c.k_t / (n_t + c.k_t) if c.var_t > 0 else zero)
        theta = np.clip(np.nan_to_num(g_hat + u_hat, nan=0.0, posinf=0.0, neginf=0.0), -THETA_MAX, THETA_MAX)
        return theta, np.clip(np.nan_to_num(var, nan=0.0, posinf=0.0), 0.0, THETA_MAX ** 2)

    def effect(self, traj_n: int, traj_sum: float, group: int) -> tuple[float, float]:
        """:meth:`effects` of one trajectory."""
        theta, var = self.effects(np.array([traj_n]), np.array([traj_sum]), np.array([group]))
        return float(theta[0]), float(var[0])

    def resolved(self, variance: np.ndarray) -> np.ndarray:
        """The share of the effects' variance an estimate has resolved, 1 - (its
        error's variance) / (sigma_G^2 + sigma_T^2): 0 for a trajectory with no call in
        a group with none (its calls follow the pooled distribution), towards 1 as calls
        end (they follow the baseline at its effect)."""
        c = self.components()
        total = c.var_t + c.var_g
        if total <= 0:
            return np.zeros(np.shape(variance))
        return np.clip(1.0 - np.asarray(variance, dtype=float) / total, 0.0, 1.0)
