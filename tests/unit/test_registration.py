import random

from ate_devplugin.registration import Backoff


def test_backoff_grows_jittered_and_caps() -> None:
    backoff = Backoff(initial=0.02, cap=1.0, rng=random.Random(7))
    delays = [backoff.next() for _ in range(10)]
    nominal = [min(1.0, 0.02 * 2**n) for n in range(10)]
    for delay, d in zip(delays, nominal, strict=True):
        assert d / 2 <= delay <= d
    assert len(set(delays)) == len(delays)  # jittered, not a fixed ladder
    backoff.reset()
    assert backoff.next() <= 0.02
