"""Graph.pad(mode="reflect" / "replicate") against numpy.pad's "reflect" and "edge"
(torch.nn.functional.pad's reflect and replicate), static and symbolic dims, the size
rules, and export/import."""
import numpy as np
import pytest

import jitml

NP_MODE = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def pad_graph(ctx, name, shape, low, high, mode, dtype="float32"):
    g = jitml.Graph(ctx, name)
    x = g.input("x", dtype, shape)
    g.output(g.pad(x, low, high, mode=mode))
    return g.finalize()


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pads_match_numpy(ctx, mode):
    # A size-1 dim padded by one: replicate only (reflect needs pads below the size).
    hi0 = 0 if mode == "reflect" else 1
    g = pad_graph(ctx, "pad_" + mode, ("N", "H", 5), (0, 2, 1), (hi0, 3, 4), mode)
    rng = np.random.default_rng(7)
    for n, h in ((1, 4), (2, 7), (3, 13)):
        x = rng.standard_normal((n, h, 5)).astype(np.float32)
        want = np.pad(x, ((0, hi0), (2, 3), (1, 4)), mode=NP_MODE[mode])
        np.testing.assert_array_equal(g(x), want)


def test_reflect_f16_matches_torch(ctx):
    torch = pytest.importorskip("torch")
    g = pad_graph(ctx, "pad_reflect_f16", (1, 3, 6, 6), (0, 0, 2, 2), (0, 0, 2, 2),
                  "reflect", "float16")
    x = torch.randn(1, 3, 6, 6).half()
    want = torch.nn.functional.pad(x.float(), (2, 2, 2, 2), mode="reflect").half()
    assert torch.equal(g(x), want)


def test_reflect_pad_must_be_below_the_size(ctx):
    g = pad_graph(ctx, "pad_reflect_big", ("N",), (3,), (0,), "reflect")
    np.testing.assert_array_equal(g(np.arange(4, dtype=np.float32)),
                                  np.pad(np.arange(4, dtype=np.float32), (3, 0), "reflect"))
    with pytest.raises(jitml.JitError) as e:
        g(np.arange(3, dtype=np.float32))  # pad 3 is not below 3
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH
    assert "reflect" in e.value.message
    s = jitml.Graph(ctx, "pad_reflect_static")
    x = s.input("x", "float32", (2,))
    with pytest.raises(jitml.JitError) as e:
        s.output(s.pad(x, (2,), (0,), mode="reflect"))
        s.finalize()
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH


def test_bad_mode(ctx):
    g = jitml.Graph(ctx, "pad_bad_mode")
    x = g.input("x", "float32", (4,))
    with pytest.raises(jitml.JitError) as e:
        g.pad(x, (1,), (1,), mode="symmetric")
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT


def test_modes_export_and_import(ctx):
    for mode in ("reflect", "replicate", "circular"):
        g = pad_graph(ctx, "pad_export_" + mode, (3, 4), (1, 2), (2, 1), mode)
        h = jitml.Graph.from_mlir(ctx, g.to_mlir())
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(h(x), np.pad(x, ((1, 2), (2, 1)), NP_MODE[mode]))


def test_circular_matches_torch_and_wraps_once(ctx):
    torch = pytest.importorskip("torch")
    g = pad_graph(ctx, "pad_circular_t", (1, 2, "W"), (0, 0, 3), (0, 0, 2), "circular")
    x = torch.randn(1, 2, 5)
    assert torch.equal(g(x), torch.nn.functional.pad(x, (3, 2), mode="circular"))
    x3 = torch.randn(1, 2, 3)  # pads of 3 and 2 wrap at most once: fine
    assert torch.equal(g(x3), torch.nn.functional.pad(x3, (3, 2), mode="circular"))
    with pytest.raises(jitml.JitError) as e:
        g(torch.randn(1, 2, 2))  # a pad of 3 on 2 elements would wrap twice
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH
    assert "circular" in e.value.message
