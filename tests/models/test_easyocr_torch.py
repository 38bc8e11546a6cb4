"""The easyocr engine computes EasyOCR's network: the generation-2 CRNN built in torch
(layer for layer as EasyOCR defines it, so english_g2.pth loads into it strictly), fed the
same prepared crops, gives the log-probabilities our onnxruntime graph gives, and our
torch-free checkpoint reader returns exactly torch's state dict."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from ocrfleet.engines.easyocr import (  # noqa: E402
    EasyOCRRecogniser,
    _pad,
    default_model_path,
    load_weights,
    padded_width,
    prepare,
)
from tests.unit.test_ctc_engines import uw3_lines  # noqa: E402

pytestmark = pytest.mark.models


class _BiLSTM(nn.Module):
    def __init__(self, size: int, hidden: int, out: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(size, hidden, bidirectional=True, batch_first=True)
        self.linear = nn.Linear(2 * hidden, out)

    def forward(self, x):
        return self.linear(self.rnn(x)[0])


class _Features(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ConvNet = nn.Sequential(
            nn.Conv2d(1, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(64, 128, 3, 1, 1), nn.ReLU(),
            nn.Conv2d(128, 128, 3, 1, 1), nn.ReLU(), nn.MaxPool2d((2, 1), (2, 1)),
            nn.Conv2d(128, 256, 3, 1, 1, bias=False), nn.BatchNorm2d(256), nn.ReLU(),
            nn.Conv2d(256, 256, 3, 1, 1, bias=False), nn.BatchNorm2d(256), nn.ReLU(),
            nn.MaxPool2d((2, 1), (2, 1)),
            nn.Conv2d(256, 256, 2, 1, 0), nn.ReLU(),
        )  # fmt: skip

    def forward(self, x):
        return self.ConvNet(x)


class Generation2(nn.Module):
    """EasyOCR's `vgg_model.Model(input_channel=1, output_channel=256, hidden_size=256)`."""

    def __init__(self, classes: int = 97) -> None:
        super().__init__()
        self.FeatureExtraction = _Features()
        self.AdaptiveAvgPool = nn.AdaptiveAvgPool2d((None, 1))
        self.SequenceModeling = nn.Sequential(_BiLSTM(256, 256, 256), _BiLSTM(256, 256, 256))
        self.Prediction = nn.Linear(256, classes)

    def forward(self, image):
        features = self.FeatureExtraction(image)  # (N, C, H, W)
        features = self.AdaptiveAvgPool(features.permute(0, 3, 1, 2)).squeeze(3)  # (N, W, C)
        return self.Prediction(self.SequenceModeling(features).contiguous())


@pytest.fixture(scope="module")
def reference() -> Generation2:
    state = torch.load(default_model_path(), map_location="cpu", weights_only=True)
    model = Generation2()
    model.load_state_dict({key.removeprefix("module."): v for key, v in state.items()})
    return model.eval()


def test_torch_free_reader_returns_torchs_state_dict() -> None:
    state = torch.load(default_model_path(), map_location="cpu", weights_only=True)
    ours = load_weights(default_model_path())
    assert set(ours) == {key.removeprefix("module.") for key in state}
    for key, tensor in state.items():
        np.testing.assert_array_equal(ours[key.removeprefix("module.")], tensor.numpy())


def test_onnx_graph_gives_the_networks_log_probs_on_real_crops(reference, tmp_path) -> None:
    engine = EasyOCRRecogniser(threads=1, cache_dir=tmp_path)
    lines = uw3_lines(16)
    crops = [crop for crop, _ in lines]
    ours = engine.posteriors(crops)
    worst = 0.0
    with torch.no_grad():
        for crop, posterior in zip(crops, ours, strict=True):
            image = _pad(prepare(crop), padded_width(crop))[None, None]
            logits = reference(torch.from_numpy(image))
            expected = torch.log_softmax(logits, dim=-1)[0].numpy()
            assert expected.shape == posterior.log_probs.shape
            # Classes the model all but rules out (p < 1e-6) differ more in log terms.
            seen = expected > np.log(1e-6)
            worst = max(worst, float(np.abs(expected - posterior.log_probs)[seen].max()))
            assert "".join(
                engine.charset[c]
                for i, c in enumerate(expected.argmax(1))
                if c and (i == 0 or expected.argmax(1)[i - 1] != c)
            ) == posterior.text()
    print(f"max |log-prob difference| torch vs onnxruntime: {worst:.2e}")
    assert worst < 1e-3, worst
