"""The install the README gives, which CI runs word for word (.ci/run reads it from the README): the CPU build of
torch on a machine without a GPU, and one install line for the demo and the tests."""
import re
from pathlib import Path

import pytest
import torch

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_torch_is_the_cpu_build_on_a_machine_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: a CUDA build of torch is the right one")
    assert torch.version.cuda is None, (f"torch {torch.__version__} is a CUDA build (CUDA {torch.version.cuda}) on a "
                                        "machine without a GPU: several GB that nothing uses; install the README's")


def test_the_demo_and_the_tests_install_alike_with_the_cpu_torch_first():
    demo, tests = (re.search(rf"^# install, then run {what}.*\n(.*)$", README, re.M).group(1)
                   for what in ("the CPU demo", "the tests"))
    assert demo.endswith(" && python train.py") and tests.endswith(" && python -m pytest -q")
    install = tests.removesuffix(" && python -m pytest -q")
    assert demo.removesuffix(" && python train.py") == install
    steps = install.split(" && ")
    assert re.fullmatch(r'pip install "torch==[\d.]+\+cpu" --extra-index-url https://download\.pytorch\.org/whl/cpu',
                        steps[2]) and steps[3] == "pip install -r requirements.txt", steps
