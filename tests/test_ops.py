"""The identities the growth operators promise, checked numerically."""

import math

import torch

from growtool.grow import ops


def u_vectors(d, D):
    u_old = torch.cat([torch.ones(d), torch.zeros(D - d)]) / math.sqrt(d)
    u_grow = torch.cat([torch.zeros(d), torch.ones(D - d)]) / math.sqrt(D - d)
    return u_old, u_grow


def test_rotation_maps_the_plane_as_stated():
    d, D, eps = 6, 10, 0.37
    u_old, u_grow = u_vectors(d, D)
    s = math.sqrt(1 - eps**2)
    R_uo = ops.rotate(u_old.unsqueeze(0), d, eps, 1)[0]
    R_ug = ops.rotate(u_grow.unsqueeze(0), d, eps, 1)[0]
    assert torch.allclose(R_uo, eps * u_old + s * u_grow, atol=1e-6)
    assert torch.allclose(R_ug, -s * u_old + eps * u_grow, atol=1e-6)


def test_rotation_is_orthogonal_and_identity_off_the_plane():
    d, D, eps = 5, 9, 0.6
    I = torch.eye(D, dtype=torch.float64)
    R = ops.rotate(I, d, eps, 0)  # columns: R e_j
    assert torch.allclose(R.T @ R, I, atol=1e-12)
    u_old, u_grow = u_vectors(d, D)
    u_old, u_grow = u_old.double(), u_grow.double()
    u_old, u_grow = u_old / u_old.norm(), u_grow / u_grow.norm()  # unit in float64, not float32
    v = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    v -= (v @ u_old) * u_old + (v @ u_grow) * u_grow
    assert torch.allclose(R @ v, v, atol=1e-12)
    assert torch.equal(ops.rotate(I, d, 1.0, 0), I)  # eps = 1 is no operator


def test_rotation_along_any_axis_matches_matrix():
    d, D, eps = 4, 7, 0.8
    R = ops.rotate(torch.eye(D, dtype=torch.float64), d, eps, 0)
    W = torch.randn(3, D, 2, dtype=torch.float64)
    assert torch.allclose(ops.rotate(W, d, eps, 1), torch.einsum("ij,ajb->aib", R, W), atol=1e-12)


def test_exact_layernorm_angle_maps_u_old_to_mean_direction():
    d, D = 64, 96
    eps = ops.exact_layernorm_eps(d, D)
    u_old, _ = u_vectors(d, D)
    out = ops.rotate(u_old.unsqueeze(0).double(), d, eps, 1)[0]
    assert torch.allclose(out, torch.ones(D, dtype=torch.float64) / math.sqrt(D), atol=1e-12)


def test_convex_expansion_weights_are_convex_and_old_entries_kept():
    g = torch.Generator().manual_seed(0)
    e = ops.make_expansion("convex", 6, 10, g, k=3)
    assert (e.weight >= 0).all() and torch.allclose(e.weight.sum(1), torch.ones(4))
    W = torch.randn(6 * 2, 5)
    out = ops.expand_axis(W, 0, e, block=2)
    assert torch.equal(out[:12], W)
    blocks = W.view(6, 2, 5)
    want = sum(e.weight[0, j] * blocks[e.index[0, j]] for j in range(3))
    assert torch.allclose(out[12:14], want, atol=1e-6)


def test_tile_and_mean_and_zero_expansions():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(3, 4)
    tile = ops.expand_axis(W, 1, ops.make_expansion("tile", 4, 10, g))
    assert torch.equal(tile[:, 4:8], W) and torch.equal(tile[:, 8:], W[:, :2])
    mean = ops.expand_axis(W, 1, ops.make_expansion("mean", 4, 6, g))
    assert torch.allclose(mean[:, 4:], W.mean(1, keepdim=True).expand(3, 2))
    zero = ops.expand_axis(W, 1, ops.make_expansion("zero", 4, 6, g))
    assert (zero[:, 4:] == 0).all()


def test_split_factors_keep_the_sum_of_writes():
    g = torch.Generator().manual_seed(3)
    e = ops.make_expansion("copy", 5, 9, g)
    f = ops.split_factors(e)
    total = f[:5].clone()
    total.index_add_(0, e.index[:, 0], f[5:])
    assert torch.allclose(total, torch.ones(5))


def test_group_to_heads_keeps_query_heads_in_their_new_group():
    g = torch.Generator().manual_seed(1)
    kv = ops.make_expansion("convex", 2, 3, g)
    q = ops.group_to_heads(kv, 3)  # 3 query heads per KV head
    assert (q.n, q.n_new) == (6, 9)
    for t in range(3):  # new head 6 + t mixes head t of each source group
        assert torch.equal(q.index[t], kv.index[0] * 3 + t)


def test_rms_norm_growth_identity():
    """rms_D(R[h;0]) with eps d/D equals sqrt(d/D) rms_d(h) with eps."""
    d, D, eps = 8, 12, 1e-3
    h = torch.randn(d, dtype=torch.float64)
    H = ops.rotate(torch.cat([h, torch.zeros(D - d, dtype=torch.float64)]).unsqueeze(0), d, 0.5, 1)[0]
    lhs = torch.sqrt(H.pow(2).mean() + ops.grow_norm_eps(eps, d, D))
    rhs = math.sqrt(d / D) * torch.sqrt(h.pow(2).mean() + eps)
    assert torch.allclose(lhs, rhs, atol=1e-12)
    gain = ops.grow_norm_gain(torch.rand(d), D, uniform=True)
    assert torch.allclose(gain, torch.full((D,), math.sqrt(d / D)))


def test_an_embedding_norm_refit_gives_the_old_outputs_centered_and_padded():
    """ops.refit_embedding_rows / refit_embed_norm_gain: for every row (random, tiny, huge, and one
    aligned with the largest gain, near the bound B), the grown LayerNorm (eps' = eps d/D) outputs
    the old LayerNorm's output, centered, on the old dims and 0 on the new; every row has norm B."""
    g = torch.Generator().manual_seed(0)
    d, D, eps = 8, 13, 1e-5
    gain = 1 + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)
    bias = 0.3 * torch.randn(d, generator=g, dtype=torch.float64)
    top = torch.zeros(d, dtype=torch.float64)
    top[int(gain.abs().argmax())] = 1.0  # a row whose core lies along the largest gain
    e = torch.randn(23, d, generator=g, dtype=torch.float64)
    e[20:22] *= 1e-4
    e[22] = 1e3 * top
    rows = ops.refit_embedding_rows(e, gain, bias, eps, D, torch.empty(len(e), D, dtype=torch.float64))
    eps_new = ops.grow_norm_eps(eps, d, D)
    g_new = ops.refit_embed_norm_gain(gain, bias, D, eps_new)
    out = torch.nn.functional.layer_norm(rows, (D,), g_new, torch.zeros(D, dtype=torch.float64), eps_new)
    old = torch.nn.functional.layer_norm(e, (d,), gain, bias, eps)
    assert torch.allclose(out[:, :d], old - old.mean(1, keepdim=True), atol=1e-12)
    assert float(out[:, d:].abs().max()) == 0.0
    B = ops.embed_norm_bound(gain, bias)
    assert torch.allclose(rows.norm(dim=1), torch.full((len(e),), B, dtype=torch.float64))
    assert float(rows.mean(1).abs().max()) <= 1e-12
    assert float((old - old.mean(1, keepdim=True)).norm(dim=1).max()) > 0.5 * B  # the bound is not loose
    u = ops.filler_direction(D - d)
    assert abs(float(u.sum())) <= 1e-12 and abs(float(u.norm()) - 1) <= 1e-12 and float(u.abs().min()) > 0
