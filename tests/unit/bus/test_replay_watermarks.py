"""Replay asks a partition's watermarks again while the broker says its leader is moving (seen in CI on a
loaded machine: "Not leader for partition" right after the topic was created), and gives up on the rest."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from bus.replay import _watermarks

pytestmark = pytest.mark.unit


class _Answers:
    """A consumer's `get_watermark_offsets` answering from a script: an error code raises, a pair returns."""

    def __init__(self, *answers: int | tuple[int, int]) -> None:
        self.answers = list(answers)
        self.asked = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            raise KafkaException(KafkaError(answer))
        return answer


def test_a_moving_leader_is_asked_again() -> None:
    consumer = _Answers(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, (3, 9))
    assert _watermarks(consumer, TopicPartition("t", 0), timeout_s=5.0) == (3, 9)  # type: ignore[arg-type]
    assert consumer.asked == 3


def test_other_errors_and_a_spent_timeout_are_raised() -> None:
    with pytest.raises(KafkaException):
        _watermarks(_Answers(KafkaError.TOPIC_AUTHORIZATION_FAILED), TopicPartition("t", 0), 5.0)  # type: ignore[arg-type]
    stuck = _Answers(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 50)
    with pytest.raises(KafkaException):
        _watermarks(stuck, TopicPartition("t", 0), timeout_s=0.0)  # type: ignore[arg-type]
    assert stuck.asked == 1
