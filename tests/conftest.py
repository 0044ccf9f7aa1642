import os
import re

import pytest
import torch

import trident  # noqa: F401  (sets up Triton's driver on CPU-only machines)

# measured choices are not kept across tests or runs (Note [Kept measurements]): a test's timer
# decides, never an entry an earlier test or run left in the user's folder
os.environ["TRIDENT_TUNING_DIR"] = ""


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (runs on the device machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_knob_leaks():
    """A test leaves every TRIDENT_* variable as it found it (a leaked knob changes every later
    test: fused glue ran under the whole suite once after scopes entered by threads)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("TRIDENT_")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("TRIDENT_")}
    if after != before:
        for k in set(after) - set(before):
            del os.environ[k]
        os.environ.update(before)
        pytest.fail(f"the test left TRIDENT_* settings changed: {before} -> {after}")


@pytest.fixture(params=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def device(request):
    return request.param


def normalize(text: str) -> str:
    """Golden-safe text: no addresses, no process-wide counters."""
    text = re.sub(r"0x[0-9a-f]+", "0xADDR", text)
    text = re.sub(r"kernel_idx = \d+", "kernel_idx = K", text)
    text = re.sub(r"constant_args_idx = \d+", "constant_args_idx = C", text)
    text = re.sub(r"trident\.scm\.default\(\d+,", "trident.scm.default(REGION,", text)
    text = re.sub(r"\) -> [\w.]+:\n", "):\n", text)  # return annotations vary across torch versions
    return text


DEVICE_ENV = os.environ.get("TRIDENT_TEST_DEVICE", "")
