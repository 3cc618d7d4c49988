import os

# Every test runs torch on one thread, in this process and in the growtool, torchrun and shell
# processes the tests start (they inherit the environment). The models here are tiny: a second
# thread gains nothing on 2 quiet cores (the suite: 489.8 s on one thread, 486.6 s on two) and
# costs when another process shares them (a sixth slower on a busy machine). It also makes the
# in-process runs that tests compare with torchrun's processes run as those do. A test that needs
# another count sets it itself (test_hardening's determinism test passes 1 and 2).
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import FIXTURES  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(params=sorted(FIXTURES))
def fixture_ckpt(request):
    return FIXTURES[request.param]
