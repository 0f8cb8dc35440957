# The poll pacer decides on a clock; these tests drive that clock by hand.
import pytest

from workers.gpu import poll_pacer
from workers.gpu.poll_pacer import PollPacer


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(poll_pacer.time, "perf_counter", lambda: now[0])
    return now


def run_step(pacer: PollPacer, clock, seconds: float, decode_only: bool = True) -> None:
    pacer.launched(decode_only)
    clock[0] += seconds
    pacer.done()


def test_polls_early_in_a_step_and_not_near_its_expected_end(clock):
    pacer = PollPacer()
    pacer.launched(decode_only=True)
    assert pacer.may_poll()  # nothing measured yet
    clock[0] += 0.008
    pacer.done()
    pacer.polled(0.001)
    pacer.launched(decode_only=True)
    clock[0] += 0.002
    assert pacer.may_poll()  # 6 ms left, a poll takes 1 ms
    clock[0] += 0.0045
    assert not pacer.may_poll()  # 1.5 ms left: the reply could come after the step ends


def test_decode_steps_and_prompt_steps_are_timed_apart(clock):
    pacer = PollPacer()
    pacer.polled(0.001)
    run_step(pacer, clock, 0.040, decode_only=False)
    run_step(pacer, clock, 0.004, decode_only=True)
    pacer.launched(decode_only=False)
    clock[0] += 0.010
    assert pacer.may_poll()  # a prompt step runs ~40 ms
    pacer.done()
    pacer.launched(decode_only=True)
    clock[0] += 0.0025
    assert not pacer.may_poll()  # a decode step runs ~4 ms


def test_expectations_follow_recent_steps(clock):
    pacer = PollPacer()
    for _ in range(6):
        run_step(pacer, clock, 0.020)
    for _ in range(6):
        run_step(pacer, clock, 0.002)
    assert pacer.step_s[True] < 0.003
    for _ in range(6):
        pacer.polled(0.0004)
    assert pacer.poll_s < 0.0005
