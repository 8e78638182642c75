"""ONNX export of deformconv's op (deformconv/_onnx.py): ``torch.onnx.export(dynamo=True)`` writes
the standard ``DeformConv`` node, ONNX Runtime's results on it pass the oracle's f32 bound as our
op's do, and conventions ONNX cannot express stop the export."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import helper

import deformconv
import deformconv.torch as dct

PACKAGE_ROOT = Path(deformconv.__file__).resolve().parents[1]


def export(model, args, **kwargs) -> onnx.ModelProto:
    proto = torch.onnx.export(model.eval(), args, dynamo=True, verbose=False, **kwargs).model_proto
    onnx.checker.check_model(proto, full_check=True)
    return proto


def deform_nodes(proto):
    return [n for n in proto.graph.node if n.op_type == "DeformConv"]


def attributes(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def default_opset(proto) -> int:
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def run_onnxruntime(proto, inputs, extra_outputs=()):
    """The model's outputs in ONNX Runtime (CPU), then the values named in ``extra_outputs``
    (made graph outputs for the run)."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for name in extra_outputs:
        proto.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {i.name: v for i, v in zip(session.get_inputs(), inputs)}
    return session.run(None, feed)


def np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy().astype(np.float32)


# ---------------------------------------------------------------------------------------------
# One layer, its operands as model inputs
# ---------------------------------------------------------------------------------------------

# (C_in, C_out, kernel, stride, padding (top, bottom, left, right) or torchvision's, dilation,
#  groups, offset groups, mask, bias, input H x W)
CASES = {
    "v2_full": (4, 6, 3, 2, (1, 2, 0, 3), 2, 2, 2, True, True, (11, 13)),
    "v2_rect_no_bias": (4, 4, (3, 2), (1, 2), (2, 0, 1, 1), (2, 1), 1, 4, True, False, (9, 8)),
    "v1_grouped": (4, 8, 3, 1, 1, 1, 4, 1, False, True, (7, 10)),
}


class Layer(torch.nn.Module):
    def __init__(self, c_in, c_out, k, stride, padding, dilation, groups, bias, convention="torchvision"):
        super().__init__()
        self.dc = dct.DeformConv2d(
            c_in, c_out, k, stride, padding, dilation, groups, bias, convention=convention
        )

    def forward(self, x, offset, mask=None):
        return self.dc(x, offset, mask)


def make_layer(name, seed=0, convention="torchvision"):
    """``(layer, inputs as float32 arrays, the problem for deformconv.compare)``."""
    c_in, c_out, k, stride, padding, dilation, groups, og, has_mask, has_bias, (h, w) = CASES[name]
    torch.manual_seed(seed)
    layer = Layer(c_in, c_out, k, stride, padding, dilation, groups, has_bias, convention)
    if has_bias:
        torch.nn.init.uniform_(layer.dc.bias, -1, 1)
    kh, kw = layer.dc.kernel_size
    pad = deformconv.Padding(*padding) if isinstance(padding, tuple) else deformconv.Padding(*[padding] * 4)
    (sh, sw), (dh, dw) = layer.dc.stride, layer.dc.dilation
    h_out = (h + pad.top + pad.bottom - dh * (kh - 1) - 1) // sh + 1
    w_out = (w + pad.left + pad.right - dw * (kw - 1) - 1) // sw + 1
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (2, c_in, h, w)).astype(np.float32)
    # Offsets of up to 3 pixels: many samples land across the border.
    offset = rng.uniform(-3, 3, (2, 2 * og * kh * kw, h_out, w_out)).astype(np.float32)
    inputs = [x, offset]
    problem = dict(
        input=x,
        offset=offset,
        weight=np32(layer.dc.weight),
        bias=np32(layer.dc.bias) if has_bias else None,
        stride=layer.dc.stride,
        padding=tuple(pad),
        dilation=layer.dc.dilation,
        precision="f32",
    )
    if has_mask:
        mask = rng.uniform(0, 1, (2, og * kh * kw, h_out, w_out)).astype(np.float32)
        inputs.append(mask)
        problem["mask"] = mask
    return layer, inputs, problem


@pytest.fixture(scope="module", params=sorted(CASES))
def exported_layer(request):
    layer, inputs, problem = make_layer(request.param)
    # An explicit opset 19, DeformConv's: its import must say 19.
    proto = export(layer, tuple(map(torch.from_numpy, inputs)), opset_version=19)
    return request.param, layer, inputs, problem, proto


def test_a_layer_exports_as_one_deform_conv_node_with_its_attributes(exported_layer):
    name, layer, _, problem, proto = exported_layer
    c_in, c_out, k, stride, padding, dilation, groups, og, has_mask, has_bias, _ = CASES[name]
    assert [n.op_type for n in proto.graph.node] == ["DeformConv"]
    node = proto.graph.node[0]
    assert node.domain in ("", "ai.onnx")
    assert default_opset(proto) == 19
    pad = deformconv.Padding(*problem["padding"])
    assert attributes(node) == {
        "strides": list(layer.dc.stride),
        "pads": [pad.top, pad.left, pad.bottom, pad.right],
        "dilations": list(layer.dc.dilation),
        "group": groups,
        "offset_group": og,
    }
    # Inputs X, W, offset, B, mask; an absent optional input is "" (or left off at the end).
    x, offset = (i.name for i in proto.graph.input[:2])
    assert list(node.input[:3]) == [x, "dc.weight", offset]
    optional = list(node.input[3:]) + [""] * (5 - len(node.input))
    assert optional == ["dc.bias" if has_bias else "", proto.graph.input[2].name if has_mask else ""]


def test_onnxruntime_runs_the_exported_layer_within_the_f32_bound(exported_layer):
    _, layer, inputs, problem, proto = exported_layer
    (got,) = run_onnxruntime(proto, inputs)
    ours = layer(*map(torch.from_numpy, inputs))
    deformconv.assert_close(ours, **problem)
    report = deformconv.assert_close(got, **problem)
    assert report["out"].shape == tuple(ours.shape)
    assert report["out"].max_bound_ratio <= 1
    np.testing.assert_allclose(got, np32(ours), rtol=0, atol=1e-5)


@pytest.mark.parametrize("convention", ["mmcv", "dcn_v1"])
def test_conventions_onnx_cannot_express_stop_the_export(convention):
    layer, inputs, _ = make_layer("v2_full", convention=convention)
    args = tuple(map(torch.from_numpy, inputs))
    layer(*args)  # the layer itself runs
    with pytest.raises(torch.onnx.OnnxExporterError) as e:
        torch.onnx.export(layer.eval(), args, dynamo=True, verbose=False)
    message = str(e.value)
    assert f"cannot export convention {convention!r} to ONNX" in message
    assert "only convention 'torchvision' exports" in message


# ---------------------------------------------------------------------------------------------
# Seed 001's network
# ---------------------------------------------------------------------------------------------


class Seed001(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8, affine=False)
        self.offset = torch.nn.Conv2d(8, 18, 3, bias=False)
        self.layer = dct.DeformConv2d(8, 16, 3, padding=0)
        self.bn2 = torch.nn.BatchNorm2d(16, affine=False)
        self.fc = torch.nn.Linear(576, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(torch.max_pool2d(self.conv1(x), 2)))
        x = self.layer(x, self.offset(x))
        x = torch.relu(self.bn2(torch.max_pool2d(x, 2)))
        return self.fc(x.flatten(1))


def seed001():
    torch.manual_seed(1)
    net = Seed001()
    with torch.no_grad():
        net.offset.weight.mul_(4)  # offsets of a pixel or more, as after training
        for bn in (net.bn1, net.bn2):  # running statistics that are not the identity
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
    return net.eval()


def test_seed001_network_exports_and_runs_in_onnxruntime():
    net = seed001()
    x = torch.rand(4, 1, 28, 28)
    proto = export(net, (x,))
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("DeformConv") == 1, ops
    assert all(n.domain in ("", "ai.onnx") for n in proto.graph.node), ops
    assert len(proto.functions) == 0
    assert default_opset(proto) >= 19

    (node,) = deform_nodes(proto)
    assert attributes(node) == {
        "strides": [1, 1],
        "pads": [0, 0, 0, 0],
        "dilations": [1, 1],
        "group": 1,
        "offset_group": 1,
    }
    # The DeformConv node's own input, offsets and output, to judge it on what it was given.
    dc_in, dc_offset, dc_out = node.input[0], node.input[2], node.output[0]
    logits, h, offset, got = run_onnxruntime(proto, [x.numpy()], [dc_in, dc_offset, dc_out])
    assert np.abs(offset).max() > 1  # the offsets do reach other pixels
    problem = dict(
        input=h,
        offset=offset,
        weight=np32(net.layer.weight),
        bias=np32(net.layer.bias),
        precision="f32",
    )
    deformconv.assert_close(got, **problem)
    ours = dct.deform_conv2d(
        torch.from_numpy(h), torch.from_numpy(offset), net.layer.weight, net.layer.bias
    )
    deformconv.assert_close(ours, **problem)
    np.testing.assert_allclose(got, np32(ours), rtol=0, atol=1e-5)
    # The whole network against PyTorch's (float32 rounding of convolutions, BN and linear).
    with torch.no_grad():
        expected = net(x).numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# The registration itself (fresh interpreters: it depends on what was imported first)
# ---------------------------------------------------------------------------------------------


def run_python(code: str) -> None:
    code = f"import sys; sys.path.insert(0, {str(PACKAGE_ROOT)!r})\n" + textwrap.dedent(code)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_importing_deformconv_torch_registers_the_export_without_loading_onnxscript():
    """onnxscript not loaded yet: the finder registers when the exporter loads its registry."""
    run_python(
        """
        import deformconv.torch
        from deformconv import _onnx
        assert not any(m.startswith("onnxscript") for m in sys.modules), "imported onnxscript"
        assert any(isinstance(f, _onnx._Finder) for f in sys.meta_path)
        from onnxscript.function_libs.torch_lib import registration
        assert "deformconv::deform_conv2d" in registration.default_registry
        assert not any(isinstance(f, _onnx._Finder) for f in sys.meta_path), "finder left behind"
        """
    )


def test_importing_deformconv_torch_after_onnxscript_registers_at_once():
    run_python(
        """
        from onnxscript.function_libs.torch_lib import registration
        import deformconv.torch
        from deformconv import _onnx
        assert "deformconv::deform_conv2d" in registration.default_registry
        assert not any(isinstance(f, _onnx._Finder) for f in sys.meta_path)
        """
    )
