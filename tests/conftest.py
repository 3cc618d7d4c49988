import pytest
import torch

from helpers import FIXTURES


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module's tests (a shared 2-core machine runs them steadier so)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=sorted(FIXTURES))
def fixture_ckpt(request):
    return FIXTURES[request.param]
