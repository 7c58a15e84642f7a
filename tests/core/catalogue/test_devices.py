"""The device catalogue: capacities in bytes, exact about GB versus GiB, each with a source."""
import pytest

from zerolib.core.catalogue.devices import DEVICES, capacity_text, get_device

GiB = 1024**3


@pytest.mark.parametrize("name, gib", [("v100-32gb", 32), ("a100-40gb", 40), ("a100-80gb", 80),
                                       ("h100-80gb", 80), ("h200-141gb", 141),
                                       ("rtx4090-24gb", 24)])
def test_capacities_are_the_nominal_gib(name, gib):
    assert get_device(name).capacity == gib * GiB


def test_a100_80gb_in_bytes_and_gb():
    # nvidia-smi reports 81920 MiB for an A100 80GB: 81920 * 2**20 bytes.
    assert get_device("a100-80gb").capacity == 81920 * 2**20 == 85_899_345_920


def test_every_device_names_its_source():
    for device in DEVICES.values():
        assert device.source and device.label and device.name == device.name.lower()


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(ValueError, match="device must be one of v100-32gb, a100-40gb"):
        get_device("a100-90gb")


def test_capacity_text_names_gib_and_gb():
    # 141 x 2^30 = 151,397,597,184 bytes = 151.4 GB; 80 x 2^30 = 85,899,345,920 bytes = 85.9 GB.
    assert capacity_text("h200-141gb") == "141 GiB = 151.4 GB"
    assert capacity_text("a100-80gb", "GB") == "80 GiB = 85.9 GB"
    assert capacity_text("a100-80gb", "GiB") == "80 GiB"
    with pytest.raises(ValueError, match="unit"):
        capacity_text("a100-80gb", "MB")
