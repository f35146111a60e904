"""The async sampler's rules (shared by the simulator and the live driver), hand-computed."""

from prorsa_sim import sampler


def test_the_async_sampler_rules_on_hand_computed_cases():
    # 1 + 2/4 = 1.5 batches live: 384 of a 256 batch; 3x at staleness 8; an explicit factor wins.
    assert sampler.live_cap(256, 2) == 384
    assert sampler.live_cap(256, 8) == 768
    assert sampler.live_cap(256, 2, over_dispatch=1.0) == 256
    # (0 + 2 + 1) x 256 / 0.8 = 960 launched at version 0; 1280 at version 1.
    assert sampler.launch_budget(0, 2, 256, 0.8) == 960
    assert sampler.launch_budget(1, 2, 256, 0.8) == 1280
    # Under both bounds: dispatch; at either bound: not, unless a GRPO group is open.
    assert sampler.may_dispatch(live=10, launched=16, cap=384, budget=960, group_size=8)
    assert not sampler.may_dispatch(live=384, launched=16, cap=384, budget=960, group_size=8)
    assert not sampler.may_dispatch(live=10, launched=960, cap=384, budget=960, group_size=8)
    assert sampler.may_dispatch(live=384, launched=963, cap=384, budget=960, group_size=8)
    # A batch of admitted rewards per version; stale past the bound only.
    assert not sampler.trainer_ready(255, 0, 256) and sampler.trainer_ready(512, 1, 256)
    assert sampler.is_stale(0, 3, 2) and not sampler.is_stale(1, 3, 2)
