"""The model's limits: the largest resource and the largest Allocate answer fit the kubelet's message limit."""

from __future__ import annotations

import pytest

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.config import (
    MAX_DEVICES,
    MAX_ENV,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_MESSAGE_BYTES,
    MAX_MOUNTS,
    MAX_PATH_CHARS,
    max_units,
)


@pytest.mark.parametrize("prefix", ["kvm", "a" * 63])
def test_max_units_is_exactly_the_message_limit(prefix: str) -> None:
    def size(units: int) -> int:
        ids = [f"{prefix}-{n}" for n in range(units)]
        return pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Unhealthy") for i in ids]).ByteSize()

    n = max_units(len(prefix))
    assert size(n) <= MAX_MESSAGE_BYTES < size(n + 1)


def test_the_largest_allocate_answer_fits_one_message() -> None:
    """Every count and length at its cap, every character 4 bytes of UTF-8: still one message."""
    path = "/" + "\U0001f600" * (MAX_PATH_CHARS - 1)
    answer = pb.AllocateResponse(
        container_responses=[
            pb.ContainerAllocateResponse(
                envs={f"{n:0{MAX_ENV_NAME_CHARS}d}": "\U0001f600" * MAX_ENV_VALUE_CHARS for n in range(MAX_ENV)},
                mounts=[pb.Mount(container_path=path, host_path=path, read_only=True)] * MAX_MOUNTS,
                devices=[pb.DeviceSpec(container_path=path, host_path=path, permissions="rwm")] * MAX_DEVICES,
            )
        ]
    )
    assert answer.ByteSize() <= MAX_MESSAGE_BYTES
